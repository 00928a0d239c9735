"""The DEQ training figures the docs publish are those of their runs: the held-out seeds' sentence and
table come from the stored record ``docs/bench/deq_heldout.json`` (written by ``benchmarks.deq
train --record``), the seeds 0-9 figure from the per-run table of docs/bench/deq.md, and every page that
repeats a figure repeats it with its seeds."""

import json
import re

import pytest
from conftest import REPO

import benchmarks.deq.train as bench_deq

RECORD = REPO / "docs" / "bench" / "deq_heldout.json"
BENCH_PAGE = REPO / "docs" / "bench" / "deq.md"
#: Every page that repeats the DEQ training figures.
PAGES = [REPO / "README.md", REPO / "docs" / "benchmarks.md", BENCH_PAGE, REPO / "docs" / "guides" / "deq.md"]
#: The rows of the seeds 0-9 per-run table of the regularised arm, and its column of max evaluations.
ARM_ROW, MAX_COLUMN = "| spectral 0.5, 20 it. |", 5


def flat(text: str) -> str:
    """Markdown wraps sentences anywhere: compare with every run of whitespace as one space."""
    return re.sub(r"\s+", " ", text)


def record():
    return json.loads(RECORD.read_text())


def test_held_out_figures_are_the_records():
    rec = record()
    statement = bench_deq.record_statement(rec)
    for page in PAGES:
        assert statement in flat(page.read_text()), (
            f"{page.name} does not state {statement!r} ({RECORD.name})"
        )
    table = "\n".join(bench_deq.record_table(rec))
    assert table in BENCH_PAGE.read_text(), f"{BENCH_PAGE.name}: the held-out table is not {RECORD.name}'s"
    # the page gives the command that wrote the record
    assert flat(rec["command"]) in flat(BENCH_PAGE.read_text()).replace(" \\ ", " ")


def test_seeds_0_to_9_figure_is_the_per_run_tables_max():
    rows = [line for line in BENCH_PAGE.read_text().splitlines() if line.startswith(ARM_ROW)]
    seeds = [int(row.split("|")[2]) for row in rows]
    assert seeds == list(range(10)), f"{BENCH_PAGE.name}: per-run rows of seeds {seeds}"
    worst = max(int(row.split("|")[MAX_COLUMN]) for row in rows)
    statement = f"every training solve met 1e-4 within {worst} evaluations in all 300 epochs of seeds 0-9"
    for page in PAGES:
        assert statement in flat(page.read_text()), f"{page.name} does not state {statement!r}"


def test_record_statement_follows_the_numbers():
    rec = {
        "tol": 1e-4,
        "epochs": 3,
        "max_iter": 100,
        "pretrain_epochs": 1,
        "runs": {"arm": {"101": {"max_evaluations": [8, 12, 9], "unconverged_epochs": []}}},
    }
    assert bench_deq.record_statement(rec).endswith(
        "within 12 evaluations in all 3 epochs of held-out seeds 101-101"
    )
    rec["runs"]["arm"]["103"] = {"max_evaluations": [8, 25, 100], "unconverged_epochs": [3]}
    assert bench_deq.record_statement(rec) == (
        "in 1 epochs of 6 a training solve missed 1e-4 (budget 100); held-out seeds 101, 103"
    )
    table = bench_deq.record_table(rec)
    assert table[3] == "| arm | 103 | 3 | 100 (3) | 2 | 1 | 1 |"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_no_page_states_the_bound_without_its_seeds(page):
    # "within N evaluations" about DEQ training is always followed by the seeds it was measured on
    text = flat(page.read_text())
    for match in re.finditer(r"within (\d+) evaluations in all 300 epochs(.{0,40})", text):
        assert re.match(r" of (held-out )?seeds \d", match.group(2)), f"{page.name}: {match.group(0)!r}"
