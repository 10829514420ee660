"""Resume files (interp.resume_file): an edited or damaged file is refused with one clear error instead of resuming
to another model; a file written before the checksum entry existed still reads."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from interp.errors import CheckpointError
from interp.resume_file import CHECKSUM, read_resume_file, write_resume_file


def _written(tmp_path):
    g = torch.Generator().manual_seed(0)
    tensors = {"model.W": torch.randn(3, 4, 2, generator=g), "adam.exp_avg.W": torch.randn(3, 4, 2, generator=g)}
    path = write_resume_file(
        tmp_path / "run.resume", tensors, {"seed": 0}, "the resume file", progress={"epoch": 3, "best": 0.9}
    )
    return path, tensors


def _rewrite(path, tensors=None, meta=None):
    """The file saved again with edited tensors or metadata (as someone editing it by hand would)."""
    with safe_open(str(path), "pt") as f:
        raw = dict(f.metadata())
    save_file(load_file(str(path)) if tensors is None else tensors, str(path), metadata={**raw, **(meta or {})})


def test_a_resume_file_reads_back_what_was_written(tmp_path):
    path, tensors = _written(tmp_path)
    read, meta = read_resume_file(path, "resume file", required=("identity", "progress"))
    assert all(torch.equal(read[k], v) for k, v in tensors.items()) and set(read) == set(tensors)
    assert meta["identity"] == {"seed": 0} and meta["progress"] == {"epoch": 3, "best": 0.9}
    assert meta[CHECKSUM].startswith("sha256:")


@pytest.mark.parametrize(
    "edit",
    ["a moment nudged", "a tensor removed", "a tensor added", "a tensor transposed", "the progress edited"],
)
def test_an_edited_resume_file_is_refused(tmp_path, edit):
    path, tensors = _written(tmp_path)
    t = {k: v.clone() for k, v in tensors.items()}
    meta = None
    if edit == "a moment nudged":
        t["adam.exp_avg.W"][0, 0, 0] += 0.5
    elif edit == "a tensor removed":
        del t["adam.exp_avg.W"]
    elif edit == "a tensor added":
        t["extra"] = torch.zeros(2)
    elif edit == "a tensor transposed":
        t["model.W"] = t["model.W"].transpose(1, 2).contiguous()
    else:
        meta = {"progress": json.dumps({"epoch": 3, "best": 0.95})}
    _rewrite(path, t, meta)
    with pytest.raises(CheckpointError, match="does not match its checksum: it was edited or is corrupt"):
        read_resume_file(path, "resume file", required=("identity", "progress"))


def test_a_resume_file_without_a_checksum_still_reads(tmp_path):
    """Files written before the checksum entry existed (a sweep killed before an upgrade) resume as before."""
    path, tensors = _written(tmp_path)
    with safe_open(str(path), "pt") as f:
        raw = {k: v for k, v in f.metadata().items() if k != CHECKSUM}
    save_file(load_file(str(path)), str(path), metadata=raw)
    read, meta = read_resume_file(path, "resume file")
    assert all(torch.equal(read[k], v) for k, v in tensors.items()) and CHECKSUM not in meta


def test_the_checksum_entry_is_the_files_own(tmp_path):
    with pytest.raises(ValueError, match="the resume file's own metadata entry"):
        write_resume_file(tmp_path / "r", {}, {}, "the resume file", checksum="x")


@pytest.mark.parametrize(
    "shape",
    [
        dict(n_heads=1, d_head=8, output_matrix="identity"),
        dict(n_heads=64, d_head=2, output_matrix="learned"),
        dict(n_layers=2, attn_only=False, d_mlp=16),
    ],
    ids=["1 head", "64 heads, trained W_O", "2 layers with MLP"],
)
def test_a_solo_runs_edited_resume_file_is_refused_and_an_intact_one_resumes(
    tmp_path, tiny_task, tiny_spec, tiny_cfg, shape
):
    """The trainer's own resume files on the shapes at both ends and a 2-layer model: an intact one continues to an
    uninterrupted run's weights bit for bit; one whose first Adam moment was nudged is refused."""
    from dataclasses import replace

    from interp.training import resume_path, train

    spec, cfg = replace(tiny_spec, **shape), tiny_cfg(epochs=2, save_every=1)
    kw = dict(device="cpu", progress=False)
    train(tiny_task, spec, cfg, tmp_path / "whole.safetensors", **kw)

    def stop(epoch, record):
        if epoch == 1:
            raise KeyboardInterrupt

    for name in ("intact", "edited"):
        out = tmp_path / f"{name}.safetensors"
        with pytest.raises(KeyboardInterrupt):
            train(tiny_task, spec, cfg, out, on_epoch_end=stop, **kw)
        rpath = resume_path(out)
        if name == "edited":
            t = load_file(str(rpath))
            moment = next(k for k in sorted(t) if "exp_avg" in k)
            t[moment].view(-1)[0] += 0.5
            _rewrite(rpath, t)
            with pytest.raises(CheckpointError, match="does not match its checksum"):
                train(tiny_task, spec, cfg, out, resume=True, **kw)
        else:
            train(tiny_task, spec, cfg, out, resume=True, **kw)
            a, b = load_file(str(out)), load_file(str(tmp_path / "whole.safetensors"))
            assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
