"""A multirun checks every job with its swept values before the first starts: a bad value in one
job of a sweep is one message naming the job, exit status 2, and no sweep directory, also for
``range``/``choice`` sweeps."""

from conftest import run_cli


def test_a_bad_swept_value_is_refused_before_any_job(tmp_path):
    overrides = [
        "seed=range(0,2)",
        "model.hidden_channels=8,abc",
        "optim.lr=choice(0.01)",
        "trainer.epochs=1",
    ]
    run = run_cli(
        "-m",
        "revgnn.train",
        "-m",
        *overrides,
        f"hydra.sweep.dir={tmp_path / 'sweep'}",
        cwd=tmp_path,
        expect=2,
    )
    text = run.output.strip()
    assert "Traceback" not in text, text
    assert text == (
        "revgnn-train: sweep job 1 (seed=0 model.hidden_channels=abc optim.lr=0.01): "
        "model.hidden_channels must be an int, got 'abc'"
    ), text
    assert sorted(p.name for p in tmp_path.iterdir()) == [], text
