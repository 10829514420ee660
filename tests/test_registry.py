"""The task registry (``interp.registry``): registering in Python, entry points of installed packages (a real
``*.dist-info`` folder on ``sys.path``, found by ``importlib.metadata`` as an installed package's would be), the
errors (a name taken, a broken entry point, an unknown name), suites and checkpoints found through it, and the
sweep's refusal to send a task registered in this process only to Ray workers."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

import interp
from interp import registry
from interp.errors import CheckpointError, ConfigError, TaskError

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "own_task" / "parens_task.py"
SMALL = dict(train_size=64, val_size=16, test_size=32, max_len=6)


def dist_info(folder: Path, name: str, entry_points: dict[str, str], version: str = "0.1.0") -> Path:
    """A minimal installed distribution's metadata in ``folder``: what ``pip install`` writes for the entry points
    (``METADATA`` and ``entry_points.txt``)."""
    info = folder / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    lines = "".join(f"{k} = {v}\n" for k, v in entry_points.items())
    (info / "entry_points.txt").write_text(f"[interp.tasks]\n{lines}")
    return info


@pytest.fixture
def installed(tmp_path):
    """A folder on ``sys.path`` holding the example task module and a distribution ``interp-parens`` whose entry
    points register it (and two broken ones); the registry forgets it all afterwards."""
    shutil.copy(EXAMPLE, tmp_path / "parens_task.py")
    dist_info(
        tmp_path,
        "interp-parens",
        {
            "balanced-parens": "parens_task:PLUGIN",
            "broken-task": "no_such_module_here:PLUGIN",
            "vocab-task": "parens_task:VOCAB",
        },
    )
    sys.path.insert(0, str(tmp_path))
    registry.forget_entry_points()
    yield tmp_path
    sys.path.remove(str(tmp_path))
    sys.modules.pop("parens_task", None)
    registry.forget_entry_points()


@pytest.fixture
def parens():
    """The example task class, registered in this process for the test and forgotten afterwards."""
    sys.path.insert(0, str(EXAMPLE.parent))
    try:
        import parens_task
    finally:
        sys.path.remove(str(EXAMPLE.parent))
    yield parens_task
    for name in ("balanced-parens", "parens-again", "noisy-majority"):
        if name in registry._registered:
            registry.unregister_task(name)
    sys.modules.pop("parens_task", None)


def test_register_a_task_class_and_build_it(parens):
    plugin = interp.register_task(parens.BalancedParens)
    assert plugin.name == "balanced-parens" and "balanced-parens" in interp.task_names()
    task = interp.get_task("balanced-parens", **SMALL)
    assert isinstance(task, parens.BalancedParens) and task.params()["train_size"] == 64
    assert registry.task_source("balanced-parens") == "interp.register_task in tests.test_registry"
    assert not registry.entry_point_only("balanced-parens")
    with pytest.raises(TaskError, match="task 'balanced-parens' has no parameter 'no_such_parameter'; its parameters"):
        interp.get_task("balanced-parens", no_such_parameter=1)


def test_a_taken_name_is_refused_unless_replaced(parens):
    interp.register_task(parens.BalancedParens)
    interp.register_task(parens.BalancedParens)  # the same task again: fine (a notebook cell run twice)

    class Other(parens.BalancedParens):
        pass

    with pytest.raises(TaskError, match=r"task name 'balanced-parens' is taken by interp.register_task"):
        interp.register_task(Other, name="balanced-parens")
    assert type(interp.get_task("balanced-parens")) is parens.BalancedParens  # unchanged
    interp.register_task(Other, name="balanced-parens", replace=True)
    assert type(interp.get_task("balanced-parens")) is Other
    # a shipped task's name is taken by its entry point, which the message names
    with pytest.raises(TaskError, match=r"entry point 'noisy-majority = interp.tasks.noisy_majority:PLUGIN' of"):
        interp.register_task(parens.BalancedParens, name="noisy-majority")
    assert interp.get_task("noisy-majority", train_size=4, val_size=4, test_size=4).name == "noisy-majority"


def test_a_factory_and_a_plugin_register_too(parens):
    def factory(**params):  # a function that builds the task, not the class
        return parens.BalancedParens(**params)

    with pytest.raises(TaskError, match="give register_task"):
        interp.register_task(factory)
    interp.register_task(interp.TaskPlugin("parens-again", make=factory))
    with pytest.raises(TaskError, match="builds a task named 'balanced-parens'"):  # the name must match
        interp.get_task("parens-again")
    interp.register_task(parens.PLUGIN)
    assert interp.get_task("balanced-parens").name == "balanced-parens"


def test_an_object_that_is_not_a_task_is_named(parens):
    interp.register_task(lambda **kw: object(), name="parens-again")
    with pytest.raises(TaskError, match=r"object does not implement the Task protocol .* it lacks check_data, "):
        interp.get_task("parens-again")


def test_an_unknown_name_is_one_line_saying_how_to_register():
    with pytest.raises(TaskError) as e:
        interp.get_task("sorting")
    message = str(e.value)
    assert "\n" not in message
    assert message == (
        f"unknown task 'sorting'; registered tasks: {', '.join(interp.task_names())}; register yours with "
        "interp.register_task(YourTask) in Python or an entry point in the group 'interp.tasks' of your package "
        "(docs/own-task.md)"
    )


def test_entry_points_of_an_installed_package_are_found(installed):
    names = interp.task_names()
    assert {"balanced-parens", "broken-task", "vocab-task", "noisy-majority"} <= set(names)
    assert "parens_task" not in sys.modules  # listing names imports no plugin
    task = interp.get_task("balanced-parens", **SMALL)
    assert task.name == "balanced-parens" and type(task).__module__ == "parens_task"
    assert registry.task_source("balanced-parens") == "entry point parens_task:PLUGIN of interp-parens 0.1.0"
    assert registry.entry_point_only("balanced-parens")
    from interp.analyses import suite_for

    suite = suite_for("balanced-parens")  # the plugin's suite: a zero-argument callable, called once
    assert suite.name == "balanced-parens" and suite is suite_for(task)
    assert list(suite.corruptions(task)) == ["nested"]


def test_a_broken_entry_point_is_one_error_naming_its_distribution(installed):
    with pytest.raises(TaskError) as e:
        interp.get_task("broken-task")
    assert str(e.value).startswith(
        "the entry point 'broken-task = no_such_module_here:PLUGIN' of interp-parens 0.1.0 (group 'interp.tasks') "
        "cannot be loaded: ModuleNotFoundError"
    )
    with pytest.raises(TaskError, match=r"'vocab-task = parens_task:VOCAB' of interp-parens .* loads to a Vocab"):
        interp.get_task("vocab-task")
    assert interp.get_task("balanced-parens").name == "balanced-parens"  # the others still work
    from interp.loading import checkpoint_file

    assert checkpoint_file("noisy-majority").name == "noisy-majority.safetensors"  # names of the others still work
    with pytest.raises(CheckpointError, match=r"not searched: the entry point 'broken-task = no_such_module_here"):
        checkpoint_file("no-such-checkpoint")


def test_interp_list_names_every_task_and_where_it_comes_from(installed, capsys):
    from interp.app.cli import main

    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert "balanced-parens" in out and "entry point parens_task:PLUGIN of interp-parens 0.1.0" in out
    assert "noisy-majority" in out and "entry point interp.tasks.noisy_majority:PLUGIN of interp-toolkit" in out
    assert "broken: the entry point 'broken-task = no_such_module_here:PLUGIN' of interp-parens 0.1.0" in out


def test_suites_come_from_the_registration_or_are_generic(parens):
    from interp.analyses import suite_for
    from interp.analyses.generic_suite import SUITE as GENERIC

    interp.register_task(parens.BalancedParens)
    assert suite_for("balanced-parens") is GENERIC  # registered without a suite
    assert suite_for(parens.BalancedParens(**SMALL)) is GENERIC
    interp.register_task(parens.BalancedParens, suite="parens_task:no_such_suite")
    with pytest.raises(TaskError, match="the suite 'parens_task:no_such_suite' of task 'balanced-parens' cannot"):
        suite_for("balanced-parens")
    interp.register_task(parens.BalancedParens, suite=parens.make_suite)
    assert suite_for("balanced-parens").name == "balanced-parens"
    with pytest.raises(TaskError, match="unknown task 'no-such-task'"):
        suite_for("no-such-task")


def test_checkpoints_by_name_from_a_registered_folder(parens, tmp_path):
    """``interp.load(name)`` finds a registered task's checkpoint by file stem (and by an old name); a checkpoint of
    a task no one registered is one line saying how to register it."""
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    interp.register_task(interp.TaskPlugin("balanced-parens", parens.BalancedParens, checkpoints=folder))
    task = interp.get_task("balanced-parens", **SMALL)
    spec = interp.ModelSpec(**{**task.default_spec(), "n_layers": 1, "d_model": 8, "n_heads": 2, "d_head": 4})
    cfg = interp.TrainConfig(**{**task.default_train(), "epochs": 1})
    interp.train(task, spec, cfg, folder / "parens-tiny.safetensors", device="cpu", progress=False)
    model, again = interp.load("parens-tiny", device="cpu")
    assert again == task and model.cfg.n_layers == 1
    interp.register_task(
        interp.TaskPlugin(
            "balanced-parens", parens.BalancedParens, checkpoints=folder, aliases={"old-name": "parens-tiny"}
        )
    )
    assert interp.load_checkpoint("old-name", device="cpu").path == folder / "parens-tiny.safetensors"
    with pytest.raises(CheckpointError, match="no registered checkpoint of that name"):
        interp.load("parens-huge")
    registry.unregister_task("balanced-parens")
    with pytest.raises(CheckpointError) as e:
        interp.load(folder / "parens-tiny.safetensors")
    assert "\n" not in str(e.value) and "unknown task 'balanced-parens'" in str(e.value)
    assert "interp.register_task(YourTask)" in str(e.value)


def test_a_sweep_refuses_to_send_a_task_registered_here_to_ray(parens, tmp_path):
    from interp.app.sweeps import run_sweep

    interp.register_task(parens.BalancedParens)
    task = interp.get_task("balanced-parens", **SMALL)
    spec = interp.ModelSpec(**task.default_spec())
    cfg = interp.TrainConfig(**task.default_train())
    with pytest.raises(ConfigError, match=r"register it by an entry point in the group 'interp\.tasks'"):
        run_sweep(task, spec, cfg, [0], {}, tmp_path / "sweep", backend="ray", progress=False)
    assert not (tmp_path / "sweep").exists()  # refused before anything was written
    from interp.tasks.noisy_majority import NoisyMajority

    class Mine(NoisyMajority):  # named as a shipped task, but not what its entry point builds
        pass

    mine = Mine(train_size=8, val_size=8, test_size=8)
    spec = interp.ModelSpec(**mine.default_spec())
    with pytest.raises(ConfigError, match=r"a Ray worker would build task 'noisy-majority' .* as a NoisyMajority"):
        run_sweep(mine, spec, cfg, [0], {}, tmp_path / "sweep", backend="ray", progress=False)
    assert not (tmp_path / "sweep").exists()
