"""Sweep summaries: load_results and results.csv, rows of older sweeps, `interp table` against hand-computed
shares and Wilson intervals, `interp sweep DIR --status/--resume` and the option aliases, the population figures,
the per-head census against each model's own head summary, and `interp report DIR` in a real headless browser."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pandas as pd
import pytest

from interp.analyses.populations import newcombe_interval, population_table, strategy_differences, wilson_interval
from interp.app.cli import build_parser, main
from interp.app.sweeps import run_sweep
from interp.sweep_directory import config_columns_all, load_results, sweep_status
from interp.tasks import load_checkpoint, read_metadata
from tests.test_browser import box, browser, pixel_std  # noqa: F401  (browser: the Chromium fixture, by name)

PARAMS = dict(
    train_size=256, val_size=64, test_size=96, train_lengths=[0, 20], val_lengths=[21, 30], test_lengths=[31, 40]
)


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """A tiny sweep: d_model 4 with 1 and 2 heads (d_head 2) x two learning rates, seed 0, 2 epochs: 4 runs."""
    from interp.model import ModelSpec
    from interp.tasks import get_task
    from interp.training import TrainConfig

    task = get_task("noisy-majority", **PARAMS)
    spec = ModelSpec(**{**task.default_spec(), "d_model": 4, "n_heads": 2, "d_head": 2})
    cfg = TrainConfig(epochs=2, batch_size=64, lr=1e-2, warmup_steps=5)
    out = tmp_path_factory.mktemp("sweep")
    run_sweep(task, spec, cfg, [0], {"n_heads": [1, 2], "lr": [1e-2, 3e-3]}, out, device="cpu", progress=False)
    return out


def test_load_results_rows_and_csv(sweep):
    frame = load_results(sweep)
    assert len(frame) == 4
    for col in (
        *config_columns_all(),
        "seed",
        "best_epoch",
        "kept_epoch",
        "train_accuracy",
        "val_accuracy",
        "test_accuracy",
        "test_eos_accuracy",
        "final_active_heads",
        "wall_seconds",
        "population_size",
        "population_forward",
    ):
        assert col in frame.columns, col
    assert set(frame["strategy"]) == {"normal"} and list(frame["n_heads"]) == [1, 1, 2, 2]
    assert list(frame["final_active_heads"]) == [1, 1, 2, 2]
    for _, row in frame.iterrows():  # every metric of every split, as the checkpoint recorded it
        assert row["checkpoint"] == f"runs/{row['name']}.safetensors"  # relative: the directory can move
        meta = read_metadata(sweep / row["checkpoint"])
        for split, metrics in meta["training"]["metrics"].items():
            for name, value in metrics.items():
                assert row[f"{split}_{name}"] == value
        assert row["d_model"] == meta["model_spec"]["d_model"] and row["lr"] == meta["training"]["config"]["lr"]
        assert row["best_epoch"] == meta["training"]["best_epoch"]
    csv = pd.read_csv(sweep / "results.csv")
    assert list(csv.columns) == list(frame.columns)
    pd.testing.assert_frame_equal(
        csv[["name", "lr", "test_accuracy", "test_eos_accuracy", "final_active_heads"]],
        frame[["name", "lr", "test_accuracy", "test_eos_accuracy", "final_active_heads"]],
        check_dtype=False,
    )


def test_rows_of_older_sweeps_still_load(sweep, tmp_path):
    """The schema before this issue: grid keys only, nested accuracy; the configuration comes from the checkpoint."""
    new = [json.loads(line) for line in (sweep / "results.jsonl").read_text().splitlines()]
    old = [
        {
            "name": r["name"],
            "n_heads": r["n_heads"],
            "lr": r["lr"],
            "seed": r["seed"],
            "checkpoint": str(sweep / r["checkpoint"]),  # older sweeps wrote absolute paths
            "accuracy": r["accuracy"],
            "kept_epoch": r["kept_epoch"],
            "epochs_run": r["epochs_run"],
            "population": r["population"],
            "halving_result": None,
        }
        for r in new
    ]
    old.append({**old[0], "name": "lost", "checkpoint": str(tmp_path / "gone.safetensors")})  # checkpoint deleted
    (tmp_path / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in old))
    frame = load_results(tmp_path)
    assert len(frame) == 5 and list(frame["d_model"])[:4] == [4] * 4 and list(frame["strategy"]) == ["normal"] * 5
    assert list(frame["test_accuracy"]) == [r["accuracy"]["test"] for r in old]
    assert list(frame["test_eos_accuracy"])[:4] == list(load_results(sweep)["test_eos_accuracy"])  # from metadata
    assert list(frame["final_active_heads"])[:4] == [1, 1, 2, 2]
    assert main(["table", str(tmp_path), "--json"]) == 0


def _hand_rows(accs, **config):
    rows = []
    for i, (acc, success) in enumerate(accs):
        rows.append(
            {
                "name": f"r{i}",
                "d_model": 8,
                "n_heads": 4,
                "lr": 1e-3,
                "seed": i,
                "checkpoint": "",
                "accuracy": {"test": acc},
                "metrics": {"test": {"accuracy": acc}},
                "halving_result": None if success is None else {"success": success, "active": ["L0H0"]},
                **config,
            }
        )
    return rows


def test_table_against_hand_computed_values(tmp_path, capsys):
    normal = [1.0, 1.0, 1.0, 0.99, 0.985, 0.5, 0.2, 0.97, 0.6, 0.3]
    rows = _hand_rows([(a, None) for a in normal], strategy="normal", halving=None)
    rows += _hand_rows([(1.0, False), (1.0, True)], strategy="svc", halving="svc")  # a failed halving run scores 0
    table = population_table(rows)
    assert [(t["strategy"], t["runs"]) for t in table] == [("normal", 10), ("svc", 2)]
    a, b = table
    assert a["share_test_at_1"] == 0.3 and a["share_test_at_0.98"] == 0.5
    assert a["mean_test_accuracy"] == pytest.approx(sum(normal) / 10, abs=1e-12)
    # Wilson 95% by hand: 3/10 -> [0.1078, 0.6032]; 5/10 -> [0.2366, 0.7634]; 1/2 -> [0.0945, 0.9055]
    assert (a["share_test_at_1_low"], a["share_test_at_1_high"]) == pytest.approx((0.1078, 0.6032), abs=1e-4)
    assert (a["share_test_at_0.98_low"], a["share_test_at_0.98_high"]) == pytest.approx((0.2366, 0.7634), abs=1e-4)
    assert b["share_test_at_1"] == 0.5 and b["mean_test_accuracy"] == 0.5
    assert (b["share_test_at_1_low"], b["share_test_at_1_high"]) == pytest.approx((0.0945, 0.9055), abs=1e-4)
    assert "lr" not in a  # a column that does not vary is not shown
    (tmp_path / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    capsys.readouterr()
    assert main(["table", str(tmp_path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == json.loads(json.dumps(table))
    assert main(["table", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 3 and len({len(line) for line in lines}) == 1  # aligned
    assert "0.30 [0.11, 0.60]" in lines[1] and "0.50 [0.09, 0.91]" in lines[2]
    # bad input: one clear error each
    assert main(["table", str(tmp_path), "--split", "nope"]) == 1
    assert "no nope_accuracy" in capsys.readouterr().err
    assert main(["table", str(tmp_path / "missing")]) == 1
    assert "no sweep results" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "results.jsonl").write_text("")
    assert main(["table", str(tmp_path / "empty")]) == 1
    assert "no finished runs" in capsys.readouterr().err
    assert main(["report", str(tmp_path / "empty"), "--out", str(tmp_path / "r.html")]) == 1
    assert not (tmp_path / "r.html").exists()


# Newcombe 1998 (Interval estimation for the difference between independent proportions), Table II, method 10:
# the published 95% intervals of his eight examples a/m - b/n
NEWCOMBE_TABLE_II = [
    ((56, 70, 48, 80), (0.0524, 0.3339)),
    ((9, 10, 3, 10), (0.1705, 0.8090)),
    ((6, 7, 2, 7), (0.0582, 0.8062)),
    ((5, 56, 0, 29), (-0.0381, 0.1926)),
    ((0, 10, 0, 20), (-0.1611, 0.2775)),
    ((0, 10, 0, 10), (-0.2775, 0.2775)),
    ((10, 10, 0, 20), (0.6791, 1.0)),
    ((10, 10, 0, 10), (0.6075, 1.0)),
]


@pytest.mark.parametrize(("counts", "published"), NEWCOMBE_TABLE_II)
def test_newcombe_interval_equals_the_published_values(counts, published):
    assert newcombe_interval(*counts) == pytest.approx(published, abs=5e-5)  # published to 4 decimals


def test_strategies_compared_with_the_normal_runs_of_their_configuration(tmp_path, capsys):
    normal = [1.0, 1.0, 1.0, 0.99, 0.985, 0.5, 0.2, 0.97, 0.6, 0.3]  # 3/10 at 100%
    rows = _hand_rows([(a, None) for a in normal], strategy="normal", halving=None)
    rows += _hand_rows([(1.0, False), (1.0, True)], strategy="svc", halving="svc")  # 1/2: a failed run scores 0
    rows += _hand_rows([(1.0, True)], strategy="svc", halving="svc", lr=1e-2)  # no normal runs at this lr
    for i, r in enumerate(rows):
        r["name"] = f"run{i}"
    [d] = strategy_differences(rows)
    assert (d["strategy"], d["lr"], d["runs"], d["baseline_runs"]) == ("svc", 1e-3, 2, 10)
    assert (d["share"], d["baseline_share"]) == (0.5, 0.3) and d["difference"] == pytest.approx(0.2)
    # by hand from the two Wilson intervals: d - sqrt((p1 - l1)^2 + (u2 - p2)^2), d + sqrt((u1 - p1)^2 + (p2 - l2)^2)
    (l1, u1), (l2, u2) = wilson_interval(1, 2), wilson_interval(3, 10)
    low, high = 0.2 - math.hypot(0.5 - l1, u2 - 0.3), 0.2 + math.hypot(u1 - 0.5, 0.3 - l2)
    assert (d["difference_low"], d["difference_high"]) == pytest.approx((low, high), abs=1e-12)
    assert d["differs"] is False and low < 0 < high
    [d98] = strategy_differences(rows, threshold=0.98)  # 5/10 normal runs reach 98%
    assert d98["baseline_share"] == 0.5 and d98["difference"] == pytest.approx(0.0)
    assert strategy_differences(rows, baseline="svc")[0]["strategy"] == "normal"
    (tmp_path / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    capsys.readouterr()
    assert main(["table", str(tmp_path), "--compare", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["differences"] == json.loads(json.dumps([d])) and len(out["table"]) == 3
    assert main(["table", str(tmp_path), "--compare"]) == 0
    text = capsys.readouterr().out
    assert "strategy - normal" in text and f"+0.200 [{low:+.3f}, {high:+.3f}]" in text and text.rstrip().endswith("no")


def test_status_resume_and_option_aliases(sweep, tmp_path, capsys):
    d = tmp_path / "copy"
    shutil.copytree(sweep, d)
    rows = [json.loads(line) for line in (d / "results.jsonl").read_text().splitlines()]
    lost = d / "runs" / Path(rows[2]["checkpoint"]).name
    lost.unlink()
    status = sweep_status(d)
    assert [(s["n_heads"], s["lr"], s["done"], s["todo"]) for s in status] == [
        (1, 0.01, 1, 0),
        (1, 0.003, 1, 0),
        (2, 0.01, 0, 1),
        (2, 0.003, 1, 0),
    ]
    capsys.readouterr()
    assert main(["sweep", str(d), "--status"]) == 0
    assert "3 of 4 runs done, 1 to do" in capsys.readouterr().out
    keep = {p.name: p.stat().st_mtime_ns for p in (d / "runs").iterdir()}
    assert main(["sweep", str(d), "--resume", "--quiet", "--device", "cpu", "--threads", "1"]) == 0
    assert lost.is_file() and all((d / "runs" / n).stat().st_mtime_ns == t for n, t in keep.items())
    assert main(["sweep", str(d), "--status"]) == 0
    assert "4 of 4 runs done, 0 to do" in capsys.readouterr().out
    assert load_results(d)["test_accuracy"].tolist() == load_results(sweep)["test_accuracy"].tolist()
    p = build_parser()
    base = ["sweep", "noisy-majority", "--out", "x"]
    assert p.parse_args(base + ["--batch", "7", "--address", "auto"]).group == 7
    old = p.parse_args(base + ["--group", "7", "--ray-address", "auto"])
    assert old.group == 7 and old.ray_address == "auto" and p.parse_args(base).group == 100
    assert main(["sweep", str(d)]) == 1  # a directory takes --status or --resume
    from interp.app.sweeps import parse_grid
    from interp.errors import ConfigError

    assert parse_grid(["halving=none,svc,shapley-svc"]) == {"halving": [None, "svc", "shapley-svc"]}
    with pytest.raises(ConfigError, match="svd not among random, svc"):
        parse_grid(["halving=none,svd"])


def test_population_figures_against_hand_and_pandas(sweep):
    from interp.analyses.population_figures import Survival, accuracy_survival, grid_accuracy, lr_accuracy

    s = Survival({"a": [0.5, 1.0, 1.0, 0.98]})
    assert s.curve("a") == ([0.5, 0.98, 1.0], [1.0, 0.75, 0.5]) and s.share_at_least("a", 0.99) == 0.5
    frame = load_results(sweep)
    surv = accuracy_survival(frame)
    assert sorted(v for g in surv.groups.values() for v in g) == sorted(frame["test_accuracy"])
    assert len(surv.groups) == 4  # n_heads x lr
    grid = grid_accuracy(frame)
    assert grid.d_models == [4] and grid.n_heads == [1, 2]
    by = frame.groupby("n_heads")["test_accuracy"]
    assert grid.mean[0] == pytest.approx([by.mean()[1], by.mean()[2]], abs=1e-12)
    assert grid.share[0] == [float((by.get_group(h) >= 1).mean()) for h in (1, 2)] and grid.runs == [[2, 2]]
    assert grid.val_mean[0] == pytest.approx(list(frame.groupby("n_heads")["val_accuracy"].mean()), abs=1e-12)
    lrs = lr_accuracy(frame)
    assert lrs.varies and len(lrs.series) == 2
    for label, by_lr in lrs.series.items():
        h = 1 if "n_heads=1" in label else 2
        for lr, accs in by_lr.items():
            assert accs == frame[(frame.n_heads == h) & (frame.lr == lr)]["test_accuracy"].tolist()
    for res in (surv, grid, lrs):
        json.loads(res.to_json())
        assert res.figure() is not None


def test_census_equals_each_models_head_summary_and_resumes(sweep):
    from interp.analyses.noisy_majority.census import CENSUS, census, read_census
    from interp.analyses.noisy_majority.head_summary import head_summary

    c = census(sweep, train_size=200, test_size=80, progress=False)
    assert [r["n_heads"] for r in c.runs] == [1, 1, 2, 2] and len(c.heads()) == 6
    for run in c.runs:
        ckpt = load_checkpoint(sweep / "runs" / f"{run['name']}.safetensors", device="cpu")
        train = ckpt.task.dataset("train").select(slice(0, 200))
        test = ckpt.task.dataset("test").select(slice(0, 80))
        want = head_summary(ckpt.model, test, train=train, pairs=False)
        assert run["model_accuracy"] == pytest.approx(want.model_accuracy, abs=1e-6)
        for got, w in zip(run["heads"], want.rows):
            assert got["head"] == w["head"] and got["grade"] == w["grade"] and got["active"]
            for k in ("separation_accuracy", "learned_accuracy", "roc_auc"):
                assert got[k] == pytest.approx(w[k], abs=1e-6), k
            for k in ("w01", "w02"):
                assert got[k] == pytest.approx(w[k], rel=1e-4) or (math.isinf(got[k]) and got[k] == w[k]), k
    good = {(e["n_heads"],): e for e in c.good_heads()}
    assert good[(1,)]["runs"] == 2 and good[(2,)]["runs"] == 2
    assert sum(e[f"good_{k}"] * k for e in c.good_heads() for k in range(3) if f"good_{k}" in e) == sum(
        h["grade"] == "good" for h in c.heads()
    )
    # resumable: a cached run is not computed again (a marked entry survives), a missing one is
    cached = read_census(sweep)
    names = list(cached)
    cached[names[0]]["model_accuracy"] = -1.0
    del cached[names[1]]
    (sweep / CENSUS).write_text("".join(json.dumps(e) + "\n" for e in cached.values()))
    again = census(sweep, train_size=200, test_size=80, progress=False)
    assert again.runs[0]["model_accuracy"] == -1.0
    assert again.runs[1]["heads"] == c.runs[1]["heads"]
    assert census(sweep, train_size=200, test_size=60, progress=False).runs[0]["model_accuracy"] != -1.0  # other sizes
    surv = c.separation_survival()
    assert sorted(surv.groups) == ["1-head models", "2-head models"] and len(surv.groups["2-head models"]) == 4


@pytest.mark.slow
@pytest.mark.browser
def test_sweep_report_renders_offline_in_chromium(sweep, tmp_path, browser):
    out = tmp_path / "sweep.html"
    assert main(["report", str(sweep), "--out", str(out), "--quiet", "--threads", "1"]) == 0
    text = out.read_text(encoding="utf-8")
    for heading in (
        "Table 1",
        "Test accuracy, 1 - CDF",
        "Accuracy over d_model and n_heads",
        "Accuracy over learning rates",
        "Heads across the population",
    ):
        assert heading in text, heading
    n_figures = text.count('class="plotly-graph-div"')
    assert n_figures == 6  # 1 - CDF twice, Figure 2, Figure 3, Figure 7, per-head 1 - CDF
    if True:
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        blocked, errors = [], []

        def route(r):
            if r.request.url.split(":", 1)[0] in ("file", "data", "blob", "about"):
                r.continue_()
            else:
                blocked.append(r.request.url)
                r.abort()

        page.route("**/*", route)
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.goto(out.resolve().as_uri(), wait_until="load")
        page.wait_for_function(
            f"document.querySelectorAll('.js-plotly-plot .main-svg').length >= {n_figures}", timeout=30_000
        )
        plots = page.query_selector_all(".js-plotly-plot")
        assert len(plots) == n_figures
        for el in plots:
            w, h = box(el)
            assert w > 100 and h > 100
        plots[0].scroll_into_view_if_needed()
        assert pixel_std(browser, plots[0].screenshot()) > 5, "the first figure is blank"
        assert blocked == [] and errors == [], (blocked[:3], errors[:3])


def test_two_sweeps_into_one_directory_keep_both(tmp_path, capsys):
    """Table 1's rows come from several sweeps (normal runs, then halving runs): the second keeps the first's rows,
    sweep.json holds both plans, --status counts both and --resume retrains a lost run of the first."""
    from interp.model import ModelSpec
    from interp.sweep_directory import read_plans
    from interp.tasks import get_task
    from interp.training import TrainConfig

    task = get_task("noisy-majority", **PARAMS)
    spec = ModelSpec(**{**task.default_spec(), "d_model": 4, "n_heads": 2, "d_head": 2})
    cfg = TrainConfig(epochs=1, batch_size=64, lr=1e-2, warmup_steps=5)
    run_sweep(task, spec, cfg, [0, 1], {}, tmp_path, device="cpu", progress=False)
    run_sweep(task, spec, cfg, [0], {"lr": [3e-3]}, tmp_path, device="cpu", progress=False)
    assert len(read_plans(tmp_path)) == 2 and len(load_results(tmp_path)) == 3
    first = next((tmp_path / "runs").glob("noisy-majority-seed1-*.safetensors"))
    first.unlink()
    capsys.readouterr()
    assert main(["sweep", str(tmp_path), "--status"]) == 0
    assert "2 of 3 runs done, 1 to do" in capsys.readouterr().out
    assert main(["sweep", str(tmp_path), "--resume", "--quiet", "--device", "cpu", "--threads", "1"]) == 0
    assert first.is_file() and len(load_results(tmp_path)) == 3 and len(read_plans(tmp_path)) == 2


def test_a_results_table_without_checkpoints_still_reports(sweep, tmp_path):
    """A shipped results table (rows and census.jsonl, no checkpoints): load_results, the table and the report work;
    the census uses its cache, and runs with neither a checkpoint nor a cached entry are left out, or refused."""
    from interp.analyses.noisy_majority.census import CENSUS, census, read_census
    from interp.app.report import build_sweep_report
    from interp.errors import ConfigError

    census(sweep, progress=False)  # the default sizes, cached in the sweep
    d = tmp_path / "shipped"
    d.mkdir()
    shutil.copy(sweep / "sweep.json", d / "sweep.json")
    rows = [json.loads(line) for line in (sweep / "results.jsonl").read_text().splitlines()]
    (d / "results.jsonl").write_text(
        "".join(  # the paths of the machine that ran it
            json.dumps({**r, "checkpoint": f"/elsewhere/runs/{r['name']}.safetensors"}) + "\n" for r in rows
        )
    )
    entries = list(read_census(sweep).values())
    (d / CENSUS).write_text("".join(json.dumps(e) + "\n" for e in entries[:3]))  # the last run's entry lost
    assert len(load_results(d)) == 4 and population_table(load_results(d))
    c = census(d, progress=False, missing="skip")
    assert c.skipped == [entries[3]["name"]] and [r["heads"] for r in c.runs] == [e["heads"] for e in entries[:3]]
    with pytest.raises(ConfigError, match="checkpoint"):
        census(d, progress=False)
    page = build_sweep_report(d, progress=False).html()
    assert "Table 1" in page and "Left out: 1 runs" in page


@pytest.mark.slow
def test_two_layer_runs_sweep_table_and_report(tmp_path, tiny_task, tiny_spec, tiny_cfg):
    """Two-layer models are not batched (the token-count forward is one layer): a sweep trains them one at a time,
    and the table, the rows and the sweep report (with its census) take them like any other."""
    from dataclasses import replace

    from interp.analyses.populations import population_table
    from interp.app.report import write_sweep_report
    from interp.app.sweeps import run_sweep

    rows = run_sweep(
        tiny_task,
        replace(tiny_spec, n_layers=2),
        tiny_cfg(epochs=1),
        [0, 1],
        {},
        tmp_path,
        device="cpu",
        progress=False,
    )
    assert all(r["population"] is None and r["n_layers"] == 2 for r in rows)
    table = population_table(load_results(tmp_path))
    assert len(table) == 1 and table[0]["runs"] == 2
    out = write_sweep_report(tmp_path, tmp_path / "r.html", progress=False)
    html = out.read_text()
    assert "Table 1" in html and "L1H" in html  # the census has the second layer's heads


def test_select_rows_reads_the_configuration_as_the_table_does_and_refuses_an_unknown_key(tmp_path):
    """One selection for the scripts and tests that pick runs by KEY=VALUE: a row written before an option existed
    matches that option's default (what the run did); a key that is no column is one clear error naming it."""
    from interp.errors import ConfigError
    from interp.sweep_directory import RESULTS, select_rows, where_of

    shipped = Path(__file__).resolve().parents[1] / "examples/results/seed_regime/table1" / RESULTS
    rows = [json.loads(line) for line in shipped.read_text().splitlines()[:3]]
    old = {k: v for k, v in rows[2].items() if k != "optimizer"}  # a row that predates the option
    (tmp_path / RESULTS).write_text("".join(json.dumps(r) + "\n" for r in [*rows[:2], old]))
    names = [r["name"] for r in rows]
    assert [r["name"] for r in select_rows(tmp_path, {"optimizer": "adam"})] == names[:2]
    assert [r["name"] for r in select_rows(tmp_path, {"optimizer": "adamw"})] == names[2:]
    want = {"strategy": rows[0]["strategy"], "d_model": str(rows[0]["d_model"])}
    assert [r["name"] for r in select_rows(tmp_path, want)] == [
        r["name"] for r in rows if r["strategy"] == want["strategy"] and str(r["d_model"]) == want["d_model"]
    ]
    with pytest.raises(ConfigError, match=r"no column 'd_modle' in the results of .*expected KEY=VALUE"):
        select_rows(tmp_path, {"d_modle": "8"})
    assert where_of(["d_model=8", 'task_params={"a": 1}']) == {"d_model": "8", "task_params": '{"a": 1}'}
    with pytest.raises(ConfigError, match=r"'d_model' is not a selection \(expected KEY=VALUE"):
        where_of(["d_model"])
