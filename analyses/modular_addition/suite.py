"""Analysis suite of the ``modular-addition`` task (``interp analyze`` / ``interp report``): the key frequencies, the
embedding and neurons in the Fourier basis, the neuron-logit map, attention to ``a`` vs ``b``, the progress measures
and phases of the training run (from the checkpoint's history), and exhaustive accuracy under ablation."""

from __future__ import annotations

from dataclasses import dataclass, field

from interp.checkpoint import Checkpoint
from interp.results import Result, jsonable
from interp.suite import FunctionSuite
from interp.task import check_model_task

from . import inputs
from .exhaustive import AblationTable, AttentionSplit, ablation_table, attention_split
from .fourier import FrequencyNorms, NeuronFrequencies, embedding_norms, neuron_frequencies, neuron_logit_map
from .progress import Phases, find_phases, progress_measures, write_progress


@dataclass(eq=False)
class ModularAdditionAnalysis(Result):
    """What ``interp analyze`` gives for a modular-addition model."""

    checkpoint: str
    p: int
    key_frequencies: list[int]
    embedding: FrequencyNorms
    neurons: NeuronFrequencies
    attention: AttentionSplit
    measures: dict
    ablations: AblationTable
    phases: Phases | None = None
    w_l_key_fraction: float = 0.0
    metrics: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return jsonable(
            {
                "task": "modular-addition",
                "checkpoint": self.checkpoint,
                "p": self.p,
                "metrics": self.metrics,
                "key_frequencies": self.key_frequencies,
                "embedding": self.embedding.to_dict(),
                "neurons": self.neurons.to_dict(),
                "w_l_fraction_in_key_frequencies": self.w_l_key_fraction,
                "attention": self.attention.to_dict()["heads"],
                "progress_measures": self.measures,
                "ablations": self.ablations.rows(),
                "phases": self.phases.to_dict() if self.phases else None,
            }
        )

    @classmethod
    def from_dict(cls, d: dict) -> ModularAdditionAnalysis:
        return cls(
            d["checkpoint"],
            d["p"],
            list(d["key_frequencies"]),
            FrequencyNorms.from_dict(d["embedding"]),
            NeuronFrequencies.from_dict(d["neurons"]),
            AttentionSplit.from_dict({"heads": d["attention"]}),
            d["progress_measures"],
            AblationTable.from_dict({"ablations": d["ablations"]}),
            None if d["phases"] is None else Phases.from_dict(d["phases"]),
            d["w_l_fraction_in_key_frequencies"],
            d["metrics"],
        )

    def figure(self):
        return self.phases.figure() if self.phases else self.embedding.figure()

    def text(self) -> str:
        m, ms = self.metrics, self.measures
        lines = [
            f"{self.checkpoint} (modular-addition, p = {self.p})",
            "accuracy: " + ", ".join(f"{s} {v['accuracy']:.4f}" for s, v in m.items()),
            f"key frequencies: {', '.join(map(str, self.key_frequencies)) or 'none found'} "
            f"({self.embedding.fraction_in_keys():.1%} of the embedding's squared norm; "
            f"{self.w_l_key_fraction:.1%} of W_L's)",
            "neurons per dominant frequency (explained fraction >= "
            f"{self.neurons.threshold}): {self.neurons.clusters()}",
        ]
        if "restricted_loss" in ms:
            lines.append(
                f"restricted loss {ms['restricted_loss']:.4g}, excluded loss {ms['excluded_loss']:.4g}, "
                f"test loss {ms['test_loss']:.4g}, sum of squared weights {ms['sum_squared_weights']:.1f}"
            )
        lines.append(
            "attention from '=': "
            + "; ".join(
                f"{r['head']} a {r['to_a']:.2f} b {r['to_b']:.2f} = {r['to_=']:.2f}" for r in self.attention.rows()
            )
        )
        lines.append(
            "exhaustive accuracy (all pairs) with ablation: "
            + "; ".join(f"{r['ablated']} {r['accuracy']:.3f}" for r in self.ablations.rows())
        )
        if self.phases:
            ph = self.phases
            lines.append(
                f"phases: memorisation 0-{ph.circuit_formation}, circuit formation {ph.circuit_formation}-"
                f"{ph.cleanup}, cleanup {ph.cleanup}-{ph.grokked} (test accuracy >= 0.99 at epoch {ph.grokked}; "
                f"train accuracy >= 0.99 at epoch {ph.memorised})"
            )
        return "\n".join(lines)


def _phases(ckpt) -> Phases | None:
    history = ckpt.metadata.get("training", {}).get("history") or []
    if not history:
        return None
    return find_phases(history, ckpt.metadata.get("training", {}).get("progress_key_frequencies"))


def analyze(ckpt: Checkpoint) -> ModularAdditionAnalysis:
    from interp.evaluation import evaluate

    model, task = ckpt.model, ckpt.task
    check_model_task(model, task)
    emb = embedding_norms(model, task=task)
    keys = emb.key_frequencies
    neurons = neuron_frequencies(model, task=task, key_frequencies=keys)
    w_l = neuron_logit_map(model, task=task, key_frequencies=keys).to_dict()["fraction_in_key_frequencies"]
    metrics = {s: evaluate(model, task, task.dataset(s)) for s in task.splits + ("all",)}
    return ModularAdditionAnalysis(
        checkpoint=ckpt.name,
        p=task.p,
        key_frequencies=keys,
        embedding=emb,
        neurons=neurons,
        attention=attention_split(model, task=task),
        measures=progress_measures(model, task=task, key_frequencies=keys),
        ablations=ablation_table(model, task=task, neuron_frequencies=neurons),
        phases=_phases(ckpt),
        w_l_key_fraction=w_l,
        metrics=metrics,
    )


def add_report_sections(ckpt, report, progress: bool = False) -> None:
    """Grokking curve with phases, key frequencies, neurons, W_L, attention and ablations."""
    model, task = ckpt.model, ckpt.task
    phases = _phases(ckpt)
    report.section(
        "Grokking: progress measures and phases",
        "Train and test loss over training, with the restricted loss (only the key frequencies kept in the "
        "logits) and the excluded loss (them removed, on the training pairs), recomputed from the run's "
        "snapshots with the final model's key frequencies, and the sum of squared weights. Phases: "
        "memorisation until the test loss peaks; circuit formation until test accuracy >= 0.5; cleanup until "
        "test accuracy >= 0.99.",
    )
    if phases is None:
        report.text("This checkpoint records no training history.")
    else:
        report.figure(phases.figure())
        report.table(
            [phases.to_dict()],
            columns=["memorisation", "circuit_formation", "cleanup", "grokked_epoch", "memorised_epoch"],
        )
    emb = embedding_norms(model, task=task)
    keys = emb.key_frequencies
    report.section(
        "Key frequencies",
        "Norm of the embedding of the numbers in the Fourier basis of Z_p. A grokked model "
        "concentrates on a few frequencies. The key frequencies (red) are found automatically at the largest drop "
        "between consecutive sorted Fourier energies of the '=' logits as functions of a + b.",
    )
    report.figure(emb.figure(), caption=f"Key frequencies {keys}: {emb.fraction_in_keys():.1%} of the squared norm.")
    neurons = neuron_frequencies(model, task=task, key_frequencies=keys)
    report.section(
        "MLP neurons",
        "For each neuron, its activation at '=' over all pairs in the 2D Fourier basis of "
        "(a, b): the frequency whose terms (const x k, k x const, k x k) explain most of its variance.",
    )
    report.figure(neurons.figure())
    report.table(
        [{"frequency": k, "neurons": n, "key": k in keys} for k, n in sorted(neurons.clusters().items())],
        caption=f"Neurons whose dominant frequency explains >= {neurons.threshold} of their variance.",
    )
    wl = neuron_logit_map(model, task=task, key_frequencies=keys)
    report.section(
        "Neuron-logit map W_L",
        "W_L = W_out W_U in the Fourier basis of the output c: the neurons write "
        "only the key frequencies into the logits.",
    )
    report.figure(
        wl.figure(),
        caption=f"{wl.to_dict()['fraction_in_key_frequencies']:.1%} of W_L's squared norm lies in the key frequencies.",
    )
    att = attention_split(model, task=task)
    report.section("Attention to a vs b", "Mean attention from '=' to each input over all pairs.")
    report.table(att.rows(), formats=dict.fromkeys(("to_a", "to_b", "to_=", "a_share_std"), ".3f"))
    abl = ablation_table(model, task=task, neuron_frequencies=neurons)
    report.section(
        "Exhaustive accuracy under ablation",
        "Accuracy over all p^2 pairs (the whole domain, not a sample) "
        "with heads or the neurons of one key frequency mean-ablated.",
    )
    report.table(abl.rows(), formats={"accuracy": ".4f"})


def finish_run(out, snapshot_dir, device=None) -> dict:
    """After ``interp train ... --snapshots N``: progress measures of every snapshot into the checkpoint's history."""
    return write_progress(out, snapshot_dir, device=device)


def _hypotheses(task):
    """The task's hypotheses (``interp hypothesis``), imported when asked for."""
    from .hypotheses import hypotheses

    return hypotheses(task)


SUITE = FunctionSuite(
    "modular-addition",
    analyze,
    add_report_sections,
    finish_fn=finish_run,
    typed_fn=inputs.typed_example,
    hypotheses_fn=_hypotheses,
)
