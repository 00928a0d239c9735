"""Every benchmark under ``benchmarks/`` runs at the tiniest sizes its command line allows and prints or
writes what its docs page shows: the keys, the number of rows, finite numbers where numbers are, the
ratio columns. Not timings: a figure's value is the machine's, its presence and shape are the code's.

Each runs in this process through its ``main(argv)`` (the children a benchmark starts for its rows
are real subprocesses, at the smallest worker count; those tests are marked ``slow``, the start of a
process with torch being most of their time). A benchmark whose optional dependency is missing is
skipped saying which."""

import json
import math
import os
import signal

import pytest
import torch


@pytest.fixture
def isolated(tmp_path, monkeypatch):
    """A benchmark's main in this process: no tcmalloc re-exec (that would replace pytest), and the
    process state a benchmark sets (environment, torch threads, signal handlers, cwd) put back."""
    env, threads = dict(os.environ), torch.get_num_threads()
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    monkeypatch.setenv("REVGNN_ALLOCATOR", "system")
    # children run `python -m benchmarks.<name>` from tmp_path: the repository on their path, as
    # importing benchmarks sets it (which a previous test's environment restore may have undone)
    from benchmarks import REPO

    path = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    if str(REPO) not in path:
        monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(REPO), *path) if p))
    monkeypatch.chdir(tmp_path)
    yield tmp_path
    os.environ.clear()
    os.environ.update(env)
    torch.set_num_threads(threads)
    for s, h in handlers.items():
        signal.signal(s, h)


def json_lines(text):
    out = []
    for line in text.splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            pass
    return out


def tables(text):
    """Every markdown table in ``text``: a list of ``(header, rows)``, cells stripped."""
    found, block = [], []
    for line in [*text.splitlines(), ""]:
        if line.startswith("|"):
            block.append([c.strip() for c in line.strip().strip("|").split("|")])
        elif block:
            assert set("".join(block[1])) <= set("-:"), block[:2]
            found.append((block[0], block[2:]))
            block = []
    return found


def finite(*values):
    return all(isinstance(v, (int, float)) and math.isfinite(v) for v in values)


def number(cell: str) -> float:
    """The number a table cell starts with (``0.98``, ``1.48×``, ``**1.48×**``, ``+0.0``, ``7.2 of 200``)."""
    return float(cell.strip("*").split()[0].rstrip("x×"))


# ---- one process, in-process ---------------------------------------------------------------------


def test_compile(isolated, capsys):
    from benchmarks import compile as bench

    bench.main(["--graph", "300:3000", "--models", "mlp", "--reps", "1", "--backend", "aot_eager", "--json"])
    out = capsys.readouterr().out
    (row,) = json_lines(out)
    assert set(row) == {
        "model",
        "graph",
        "layers",
        "eager_ms",
        "compiled_ms",
        "ratio",
        "compile_s",
        "threads",
    }
    assert row["model"] == "mlp" and row["graph"] == "300:3000"
    assert finite(row["eager_ms"], row["compiled_ms"], row["compile_s"])
    assert row["ratio"] == pytest.approx(row["compiled_ms"] / row["eager_ms"])
    ((header, rows),) = tables(out)
    assert "compiled / eager" in header and len(rows) == 1 and rows[0][:2] == ["300:3000", "mlp"]
    with pytest.raises(SystemExit):
        bench.main(["--graph", "tiny"])
    assert "give one of small, proteins or NODES:EDGES" in capsys.readouterr().err


def test_optimizer(isolated, capsys):
    from benchmarks import optimizer as bench

    bench.main(["--num-layers", "2", "--hidden", "8", "--reps", "1", "--threads", "1"])
    (row,) = json_lines(capsys.readouterr().out)
    assert row["bitwise_equal"] is True and row["flat_tensors"] == 1 and row["per_tensor_tensors"] > 1
    assert finite(row["per_tensor_step_ms"], row["flat_step_ms"], row["ratio"]) and row["layers"] == 2


def test_partition(isolated, capsys):
    from benchmarks import partition as bench

    bench.main(["--nodes", "200", "--edges", "2000", "--parts", "2", "--repeats", "2", "--threads", "1"])
    out = capsys.readouterr().out
    row = json_lines(out)[-1]
    assert {k: row[k] for k in ("nodes", "edges", "parts")} == {"nodes": 200, "edges": 2000, "parts": 2}
    assert 0 < row["kept_edges"] <= 2000 and row["seconds_min"] <= row["seconds_mean"]
    assert out.count("repeat ") == 2


def test_step(isolated, capsys):
    from benchmarks import step as bench

    bench.main(
        ["--model", "revgnn_small", "--num-layers", "2", "--nodes", "200", "--edges", "2000", "--steps", "1"]
    )
    (row,) = json_lines(capsys.readouterr().out)
    assert row["depth"] == 2 and row["nodes"] == 200 and row["flat_params"] is True and row["params"] > 0
    assert finite(row["step_s"], row["warmup_s"], row["peak_rss_bytes"])
    # a shallower copy: the full depth's time is extrapolated per layer, and says so
    assert row["extrapolated_step_s"] == pytest.approx(row["step_s"] / 2 * row["full_depth"])


def test_layers(isolated, capsys):
    from benchmarks import layers as bench

    blocks = ["aggr_max", "aggr_max_torch", "gen_max", "gen_max_torch", "gen_max_pyg", "gcn", "gat"]
    argv = ["--graphs", "300:3000", "--blocks", ",".join(blocks), "--channels", "8", "--hidden", "8"]
    bench.main([*argv, "--reps", "1", "--bandwidth-mib", "4", "--matmul-n", "128", "--out", "out"])
    capsys.readouterr()
    result = json.loads((isolated / "out" / "layers.json").read_text())
    assert finite(result["bandwidth"], result["matmul_rate"])
    assert [r["block"] for r in result["rows"]] == blocks
    for r in result["rows"]:
        assert finite(r["fwd_s"], r["fwd_bwd_s"], r["bandwidth_bound_s"], r["bound_x"])
        assert (r["compute_bound_s"] is None) == (r["block"] == "gat")  # gat's FLOPs are not counted
    text = (isolated / "out" / "layers.md").read_text()
    ((header, rows),) = tables(text)
    assert "x bandwidth bound" in header and "x roofline" in header and len(rows) == len(blocks)
    assert text.count("fwd+bwd: ") == 4  # the four side-by-side ratios, every pair present
    assert (isolated / "out" / "layers.png").stat().st_size > 0


def test_sar_kernel(isolated, capsys):
    from benchmarks import sar_kernel as bench
    from revgnn.nn.kernels import load

    if load("gen_max") is None:
        pytest.skip("the gen_max C++ kernel is not available (no compiler, or REVGNN_KERNELS=0)")
    result = bench.main(
        ["--nodes", "200", "--edges", "2000", "--channels", "8", "--hidden", "8", "--reps", "1"]
    )
    assert set(result["median_s"]) == set(bench.VARIANTS) == set(result["saved_bytes"])
    assert all(finite(t) for t in result["median_s"].values()) and all(
        len(t) == 1 for t in result["times_s"].values()
    )
    assert all(b > 0 for b in result["saved_bytes"].values())
    out = capsys.readouterr().out
    assert "x one_process" in out and all(f"\n{v} " in out for v in bench.VARIANTS)


# ---- children per row ------------------------------------------------------------------------------


@pytest.mark.slow  # starts child processes
def test_memory(isolated, capsys):
    """Two stacks at depth 2 (one child each) and the drift child. 16 channels: at 8 (= the edge
    features' width) PyG's GroupAddRev would split the edge features too."""
    from benchmarks import memory as bench

    argv = ["--depths", "2", "--impls", "revgnn,pyg", "--nodes", "200", "--edges", "2000", "--channels", "16"]
    bench.main([*argv, "--reps", "1", "--out", "out"])
    capsys.readouterr()
    result = json.loads((isolated / "out" / "memory.json").read_text())
    assert [(r["impl"], r["depth"]) for r in result["rows"]] == [("revgnn", 2), ("pyg", 2)]
    for r in result["rows"]:
        assert "error" not in r, r
        assert finite(r["saved_bytes"], r["peak_rss"], r["step_s"], r["param_bytes"]) and r["saved_bytes"] > 0
    drift = result["drift"]
    assert len(drift) == 4 and {(d["precision"], d["quantize"]) for d in drift} == {
        (p, q) for p in ("float32", "bf16 autocast") for q in (None, 16)
    }
    assert all(finite(d["max_abs_err"]) for d in drift)
    assert all(d["max_abs_err"] == 0 for d in drift if d["quantize"])  # the exact coupling
    text = (isolated / "out" / "memory.md").read_text()
    (header, rows), *_ = tables(text)
    assert "step / PyG" in header and len(rows) == 2
    assert finite(number(rows[0][header.index("step / PyG")]))  # revgnn's row, against PyG's
    assert (isolated / "out" / "memory.png").stat().st_size > 0


@pytest.mark.slow  # starts child processes
def test_scale(isolated, capsys):
    """One recipe on a tiny graph: a training step at depth 2 and PyG's conv beside it, a child each."""
    from benchmarks import scale as bench

    results = bench.main(
        ["--graph", "200:4000", "--recipes", "sage", "--modes", "train", "--pyg", "--out", "out/s.md"]
    )
    capsys.readouterr()
    assert [(r["recipe"], r["mode"], r["layers"]) for r in results] == [
        ("sage", "train", 2),
        ("sage", "pyg", 1),
    ]
    for r in results:
        assert "error" not in r, r
        assert finite(r["seconds"], r["ns_per_edge_channel_layer"], r["peak_rss_gb"], r["graph_rss_gb"])
        assert (
            min(r["peak_rss_gb"], r["step_peak_rss_gb"], r["graph_rss_gb"]) > 0
        )  # ru_maxrss, VmHWM: not comparable to the KB
    (header, rows), *_ = tables((isolated / "out" / "s.md").read_text())
    assert header[-1] == "ns/(E·C·L)" and len(rows) == 2
    with pytest.raises(SystemExit):
        bench.main(["--graph", "200:4000", "--recipes", "sag"])


@pytest.mark.slow  # starts a child process
def test_scale_composition(isolated, capsys):
    """``--composition`` on products scaled down: what is alive at the step's peak adds up to the
    peak, in node states, each place named by its operator; a bad divisor is refused."""
    from benchmarks import scale as bench

    (row,) = bench.main(
        ["--graph", "products/4000", "--recipes", "gcn", "--modes", "train", "--composition"]
        + ["--warmup", "0", "--out", "out/c.md"]
    )
    capsys.readouterr()
    assert (row["nodes"], row["edges"], row["hidden"]) == (612, 30929, 160)
    parts = row["at_peak_node_states"]
    assert parts and all("@" in where or where == "smaller allocations" for _, _, where in parts)
    assert abs(sum(units for units, _, _ in parts) - row["peak_above_start_node_states"]) < 1e-9
    assert "node states above the call's start" in (isolated / "out" / "c.md").read_text()
    with pytest.raises(SystemExit):
        bench.main(["--graph", "products/0"])


def test_scale_geometric_graph_hides_a_locality_the_node_order_finds():
    """``--generator geometric``: shuffled ids put an edge's endpoints anywhere (bandwidth ~N); the RCM
    order ``--node-order rcm`` applies (as ``data.node_order`` does) brings them within a few lattice
    rows. The relabelled graph is the same graph: degrees and edge features as a multiset."""
    from benchmarks.scale import geometric_edges, make_graph
    from revgnn.data.ordering import bandwidth

    nodes, edges = 2500, 50_000  # a 50 x 50 torus, mean degree 20
    edge_index = geometric_edges(nodes, edges, torch.Generator().manual_seed(0))
    assert edge_index.shape == (2, edges) and 0 <= int(edge_index.min()) and int(edge_index.max()) < nodes
    plain = make_graph(nodes, edges, 4, 2, 3, True, "geometric", "none")
    ordered = make_graph(nodes, edges, 4, 2, 3, True, "geometric", "rcm")
    assert plain[4] == 0.0 and ordered[4] > 0  # the order's seconds
    assert bandwidth(plain[1].as_tensor()) > nodes * 0.9
    assert bandwidth(ordered[1].as_tensor()) <= 50 * 2 * 3 * 2  # ~ side x window, both ways
    for a, b in ((plain[1][1], ordered[1][1]), (plain[1][0], ordered[1][0])):
        assert torch.equal(
            torch.bincount(a, minlength=nodes).sort().values, torch.bincount(b, minlength=nodes).sort().values
        )
    assert torch.equal(plain[2].sort(0).values, ordered[2].sort(0).values)
    assert torch.equal(plain[0].sort(0).values, ordered[0].sort(0).values)


@pytest.mark.slow  # starts child processes
def test_scale_sweep(isolated, capsys):
    """``--sweep``: one child per graph size and node order; the table gives each row's ns per edge
    against the smallest graph's of its series, and a line per series."""
    from benchmarks import scale as bench

    argv = ["--sweep", "4k,8k", "--degree", "20", "--generator", "geometric", "--node-order", "none,rcm"]
    argv += ["--recipes", "gen_max", "--modes", "train", "--layers", "2", "--hidden", "8", "--out", "sw.md"]
    results = bench.main(argv)
    capsys.readouterr()
    assert [(r["edges"], r["nodes"], r["node_order"]) for r in results] == [
        (4000, 200, "none"),
        (4000, 200, "rcm"),
        (8000, 400, "none"),
        (8000, 400, "rcm"),
    ]
    for r in results:
        assert "error" not in r, r
        assert finite(r["ns_per_edge"], r["order_seconds"]) and r["generator"] == "geometric"
    text = (isolated / "sw.md").read_text()
    (header, rows), *_ = tables(text)
    assert header[-1] == "× smallest" and [row[-1] for row in rows[:2]] == ["1.00", "1.00"]
    assert "order rcm: ns/edge" in text and "x the smallest graph's" in text
    for bad in (["--sweep", "1M", "--node-order", "metis"], ["--sweep", "many"]):
        with pytest.raises(SystemExit):
            bench.main(bad)


@pytest.mark.slow  # starts child processes
def test_contention(isolated, capsys):
    """The ``deep`` model idle and "loaded" (no spinners: ``--load-per-core 0``; a spinner per CPU
    would take every core of a shared machine), each a child. The ``small`` model's rows run
    ``revgnn-train`` twice and are not run here."""
    from benchmarks import contention as bench

    argv = ["--models", "deep", "--configs", "before", "--load-per-core", "0", "--deep-layers", "1"]
    bench.main([*argv, "--deep-steps", "1", "--nodes", "200", "--edges", "2000", "--out", "table.md"])
    out = capsys.readouterr().out
    runs = [line for line in out.splitlines() if line.startswith("deep ")]
    assert len(runs) == 2 and "idle" in runs[0] and "loaded" in runs[1]
    ((header, rows),) = tables((isolated / "table.md").read_text())
    assert header[-2:] == ["loaded / idle", "idle / idle `before`"] and len(rows) == 1
    assert rows[0][1] == "`before`" and finite(number(rows[0][-2])) and number(rows[0][-1]) == 1.0


@pytest.mark.slow  # starts child processes
def test_cli_memory(isolated, capsys):
    """One ``revgnn-train`` run (the smallest: one depth, 400 nodes)."""
    from benchmarks import cli_memory as bench

    bench.main(["--depths", "1", "--nodes", "400", "--out", "report.md"])
    out = capsys.readouterr().out
    (row,) = json_lines(out)
    assert row["depth"] == 1 and finite(row["peak_mb"], row["process_max_rss_mb"], row["epoch_time_s"])
    report = (isolated / "report.md").read_text()
    ((header, rows),) = tables(report)
    assert (
        "ratio vs depth 1" in header
        and len(rows) == 1
        and rows[0][header.index("ratio vs depth 1")] == "1.000x"
    )
    assert "python -m benchmarks.cli_memory --depths 1 --nodes 400 --out report.md" in report


@pytest.mark.slow  # starts child processes
@pytest.mark.parametrize("conv", ["gen_max", "gcn"])
def test_sar(isolated, capsys, conv):
    """One process and SAR at P = 1 (one worker), the issue's epoch-time ratio between them. The naive
    and DDP modes start a worker each more and are not run here."""
    from benchmarks import sar as bench

    argv = ["--nodes", "200", "--degree", "4", "--features", "4", "--classes", "2", "--hidden", "8"]
    argv += ["--layers", "1", "--epochs", "1", "--modes", "single", "sar", "--parts", "1", "--threads", "1"]
    argv += ["--conv", conv]
    assert bench.main([*argv, "--out", "out"]) == 0
    capsys.readouterr()
    summary = json.loads((isolated / "out" / "bench_sar.json").read_text())
    assert [(r["mode"], r["P"]) for r in summary["rows"]] == [("single", 1), ("sar", 1)]
    for r in summary["rows"]:
        assert finite(r["epoch_s"], r["peak_rss_mb"], r["peak_above_base_mb"]) and r["local_edges"] > 0
    assert summary["args"]["conv"] == conv
    assert set(summary["ratios"]) == {"sar_p1_over_single_epoch"}
    assert finite(summary["ratios"]["sar_p1_over_single_epoch"])
    assert (isolated / "out" / "bench_sar.png").stat().st_size > 0


def test_sar_naive_needs_a_gen_conv(capsys):
    """The naive baseline runs PyG's GENConv: another --conv is refused before anything runs."""
    from benchmarks import sar as bench

    with pytest.raises(SystemExit):
        bench.main(["--modes", "naive", "--conv", "sage"])
    assert "a gen_* --conv, not sage" in capsys.readouterr().err


# ---- the DEQ benchmarks --------------------------------------------------------------------------

TINY_DEQ = ["--nodes", "400", "--threads", "1"]  # proteins_like's smallest graph: 8 species x 42 nodes


def test_deq_solvers(isolated, capsys):
    from benchmarks.deq import solvers

    solvers.main([*TINY_DEQ, "--hidden", "8", "--seeds", "1", "--train-steps", "1", "--max-iter", "20"])
    out = capsys.readouterr().out
    runs = [line for line in out.splitlines() if line.startswith("seed 0 trained_steps")]
    assert len(runs) == 2 * 5  # untrained and trained x the five solver configurations
    summary = [line for line in out.splitlines() if line.startswith("  after ")]
    assert len(summary) == 2 and all("anderson(m=5) / fixed_point per seed" in line for line in summary)


@pytest.mark.slow  # starts child processes
def test_deq_step_through_the_documented_command(isolated, capsys):
    """``python -m benchmarks.deq step ...``, as the docs write it; the model runs in its own child."""
    from benchmarks.deq.__main__ import main

    main(["step", *TINY_DEQ, "--hidden", "8", "--steps", "1", "--models", "deq_gnn"])
    out = capsys.readouterr().out
    (line,) = [line for line in out.splitlines() if line.startswith("deq_gnn ")]
    assert "saved-for-backward" in line and "failed" not in line
    assert "'forward_steps'" in line and "'backward_steps'" in line  # the DEQ's solver statistics
    with pytest.raises(SystemExit, match="no DEQ benchmark 'one'"):
        main(["one"])


def test_deq_peer(isolated, capsys):
    pytest.importorskip(
        "torchdeq", reason="benchmarks.deq peer compares with torchdeq (revgnn's bench extra)"
    )
    from benchmarks.deq import peer

    peer.main([*TINY_DEQ, "--max-iter", "20", "--grad-nodes", "20"])
    evals, grads, saved = tables(capsys.readouterr().out)
    assert len(evals[1]) == 2 * 2 * len(peer.PEER_SOLVERS)  # maps x tolerances x solvers
    assert [r[0] for r in grads[1]] == ["anderson", "broyden", "fixed_point"]
    assert all(finite(float(c)) for r in grads[1] for c in r[1:])
    assert [r[0] for r in saved[1]] == ["revgnn", "torchdeq"] and saved[0][1:] == [
        "10 iterations",
        "100 iterations",
    ]


def test_deq_broyden_memory(isolated, capsys):
    from benchmarks.deq import broyden_memory

    broyden_memory.main([*TINY_DEQ, "--max-iter", "20"])
    rows_table, summary = tables(capsys.readouterr().out)
    memories = len(broyden_memory.BROYDEN_MEMORIES)
    assert rows_table[0][3:] == [f"memory {m}" for m in (5, 10, 20, 40, 80)] + ["memory default (all kept)"]
    assert len(rows_table[1]) == 10 * 2  # the held-out maps x two tolerances
    assert all(c.isdigit() or c == ">20" for r in rows_table[1] for c in r[3:])
    assert len(summary[1]) == memories and all(r[1].endswith(" / 20") for r in summary[1])


def test_deq_train_record_reuse_and_jacobian(isolated, capsys):
    """Two arms x one seed of two epochs; ``--record``; ``--reuse`` takes them (and refuses another
    configuration, naming the key); ``jacobian`` reads their checkpoints."""
    from benchmarks.deq import jacobian, train

    argv = [
        *TINY_DEQ,
        "--hidden",
        "8",
        "--epochs",
        "2",
        "--eval-every",
        "1",
        "--max-iter",
        "20",
        "--seeds-list",
        "0",
    ]
    argv += ["--arms", "none", "jac_reg_weight=1", "--out-dir", "runs"]
    train.main([*argv, "--record", "record.json"])
    out = capsys.readouterr().out
    record_rows, per_run, per_arm, per_block, paired = tables(out)
    assert len(record_rows[1]) == 2  # --record's table: a row per run
    assert len(per_run[1]) == 2 and len(per_arm[1]) == 2 and len(per_block[1]) == 2
    assert all(r[2].endswith(" / 2") for r in per_run[1])  # epochs within the budget, of 2
    assert paired[0] == ["seed", "jac_reg_weight=1 − none"] and [r[0] for r in paired[1]] == [
        "0",
        "mean ± std",
        "seeds ≥ 0",
    ]
    record = json.loads((isolated / "record.json").read_text())
    assert record["command"].startswith("python -m benchmarks.deq train --nodes 400")
    assert set(record["runs"]) == {"none", "jac_reg_weight=1"}
    assert all(len(run["0"]["max_evaluations"]) == 2 for run in record["runs"].values())
    assert train.record_statement(record)  # the sentence the docs publish from a record

    train.main([*argv, "--reuse"])
    assert capsys.readouterr().out.count("(reused)") == 2
    with pytest.raises(
        SystemExit, match=r"(?s)--reuse: .*model.hidden_channels: 8 \(checkpoint\) -> 16 \(now\)"
    ):
        train.main([*[a if a != "8" else "16" for a in argv], "--reuse"])

    jacobian.main(
        [
            "--threads",
            "1",
            "--out-dir",
            "runs",
            "--arms",
            "none",
            "jac_reg_weight=1",
            "--seeds-list",
            "0",
            "--seeds",
            "1",
        ]
    )
    ((header, rows),) = tables(capsys.readouterr().out)
    assert header[5:] == [
        "‖J‖²_F / d",
        "spectral radius",
        "dominant eigenvector: participation ratio (nodes)",
    ]
    assert [r[0] for r in rows] == ["none", "jac_reg_weight=1"] and all(r[2] == "2" for r in rows)
    for r in rows:
        assert finite(float(r[5]), float(r[6])) and 1.0 <= number(r[7]) <= float(r[7].split(" of ")[1])


@pytest.mark.slow  # starts child processes
def test_pipeline_memory(isolated, capsys):
    """The proteins recipe on a raw directory of 1/1000 of ogbn-proteins' size: both runs (first load,
    cached) report every stage with finite ratios to the graph's bytes."""
    from benchmarks import pipeline_memory as bench

    argv = [
        "--scale",
        "0.001",
        "--override",
        "trainer.test_views=1",
        "--override",
        "model.hidden_channels=16",
    ]
    bench.main([*argv, "--out", "report.md"])
    report = (isolated / "report.md").read_text()
    found = tables(report)
    assert len(found) == 2  # first load, cached
    for header, rows in found:
        stages = [r[0].strip() for r in rows]
        for stage in ("OGB's loader", "features", "duplicate edges", "task", "evaluation", "final test"):
            assert stage in stages, (stage, stages)
        assert any(s.startswith("partition (x") for s in stages)
        ratio = header.index("/ graph bytes")
        assert all(finite(number(r[ratio])) and number(r[ratio]) > 0 for r in rows)
    assert "python -m benchmarks.pipeline_memory " + " ".join(argv) in report
