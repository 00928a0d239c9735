"""Partitioning for SAR: contiguous relabelling, shards, files, integrity
(hashes, fingerprints, the collective check) and the Hydra command."""

from __future__ import annotations

import json
import os
import re
import shutil

import pytest
import torch
from conftest import compose, run_cli

from revgnn.cli.partition import partition_from_config, register_partition_config
from revgnn.distributed.part_files import (
    FORMAT_VERSION,
    PartitionMismatchError,
    load_partition,
    load_partition_checked,
    save_partitions,
)
from revgnn.distributed.partition import build_partitions, partition_dataset, partition_nodes
from revgnn.testing.workers import run_workers


def _graph(n=60, e=300, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, n, (2, e), generator=g), n


def _equal_size_assignments(n=60):
    """Two different node assignments with identical part sizes."""
    a = torch.arange(n) % 2
    return a, 1 - a


def _save_pair(tmp_path):
    """Directories ``a`` and ``b``: two partitionings of one graph into two
    parts of equal sizes, complete and self-consistent."""
    ei, n = _graph()
    x = torch.randn(n, 4)
    roots = []
    for name, parts in zip("ab", _equal_size_assignments(n)):
        built = build_partitions(ei, n, 2, parts=parts, node_data={"x": x})
        save_partitions(built, str(tmp_path / name))
        roots.append(str(tmp_path / name))
    return roots


@pytest.mark.parametrize("method", ["metis", "random"])
@pytest.mark.parametrize("num_parts", [1, 2, 3, 4])
def test_parts_cover_graph_exactly(method, num_parts):
    ei, n = _graph()
    ea = torch.randn(ei.size(1), 3)
    x = torch.randn(n, 5)
    parts = build_partitions(ei, n, num_parts, method, edge_attr=ea, node_data={"x": x})
    offsets = parts[0]["offsets"]
    seen_nodes, seen_edges = [], []
    for p, part in enumerate(parts):
        lo, hi = int(offsets[p]), int(offsets[p + 1])
        assert part["node_ids"].numel() == hi - lo
        assert torch.equal(part["node_data"]["x"], x[part["node_ids"]])
        eids = part["edge_ids"]
        seen_nodes.append(part["node_ids"])
        seen_edges.append(eids)
        # every local edge points into this part; sources sorted by shard
        new_id = torch.empty(n, dtype=torch.long)
        for q, pq in enumerate(parts):
            new_id[pq["node_ids"]] = torch.arange(int(offsets[q]), int(offsets[q + 1]))
        assert torch.equal(part["dst"] + lo, new_id[ei[1, eids]])
        assert torch.equal(part["src"], new_id[ei[0, eids]])
        assert torch.equal(part["edge_attr"], ea[eids])
        ptr = part["shard_ptr"]
        for q in range(num_parts):
            src = part["src"][ptr[q] : ptr[q + 1]]
            assert bool(((src >= offsets[q]) & (src < offsets[q + 1])).all())
    assert torch.equal(torch.sort(torch.cat(seen_nodes))[0], torch.arange(n))
    assert torch.equal(torch.sort(torch.cat(seen_edges))[0], torch.arange(ei.size(1)))


def test_metis_cuts_fewer_edges_than_random():
    # two dense communities joined by a few edges
    g = torch.Generator().manual_seed(0)
    a = torch.randint(0, 50, (2, 400), generator=g)
    b = torch.randint(50, 100, (2, 400), generator=g)
    bridge = torch.tensor([[0, 60], [70, 10]])
    ei = torch.cat([a, b, bridge], 1)

    def cut(parts):
        return int((parts[ei[0]] != parts[ei[1]]).sum())

    metis = partition_nodes(ei, 100, 2, "metis")
    rand = partition_nodes(ei, 100, 2, "random")
    assert cut(metis) <= 2 < cut(rand)


def test_fingerprint_covers_the_node_assignment():
    ei, n = _graph()
    a, b = _equal_size_assignments(n)
    pa, pb = (build_partitions(ei, n, 2, parts=p) for p in (a, b))
    assert torch.equal(pa[0]["offsets"], pb[0]["offsets"])
    assert pa[0]["fingerprint"] != pb[0]["fingerprint"]
    assert pa[0]["fingerprint"] == build_partitions(ei, n, 2, parts=a)[1]["fingerprint"]
    # the edges count too: same nodes and assignment, one edge redirected
    ei2 = ei.clone()
    ei2[0, 0] = (ei2[0, 0] + 2) % n  # same part (ids of equal parity)
    assert build_partitions(ei2, n, 2, parts=a)[0]["fingerprint"] != pa[0]["fingerprint"]


def test_save_load_and_meta(tmp_path):
    ei, n = _graph()
    parts = build_partitions(
        ei, n, 3, "random", edge_attr=torch.randn(ei.size(1), 2), node_data={"y": torch.arange(n)}
    )
    save_partitions(parts, str(tmp_path / "p3"), {"dataset": {"task": "x"}})
    meta = json.loads((tmp_path / "p3" / "meta.json").read_text())
    assert meta["num_parts"] == 3 and meta["dataset"] == {"task": "x"}
    assert meta["format_version"] == FORMAT_VERSION
    assert meta["fingerprint"] == parts[0]["fingerprint"]
    assert sorted(meta["part_sha256"]) == ["part_0.pt", "part_1.pt", "part_2.pt"]
    part = load_partition(str(tmp_path / "p3"), 1, 3)
    for key in ("src", "dst", "node_ids", "edge_ids", "edge_attr"):
        assert torch.equal(part[key], parts[1][key])
    assert torch.equal(part["node_data"]["y"], parts[1]["node_data"]["y"])
    # a part stores its own nodes only, not a view of the whole node order
    ids = part["node_ids"]
    assert ids.untyped_storage().nbytes() == ids.numel() * ids.element_size()
    with pytest.raises(PartitionMismatchError, match="holds 3 parts but the job runs 4 workers"):
        load_partition(str(tmp_path / "p3"), 1, 4)
    with pytest.raises(PartitionMismatchError, match="partition the graph"):
        load_partition(str(tmp_path / "nothing"), 0, 3)
    os.remove(tmp_path / "p3" / "part_2.pt")
    with pytest.raises(PartitionMismatchError, match="part_2.pt is missing"):
        load_partition(str(tmp_path / "p3"), 2, 3)


def _flip(path):
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def _truncate(path):
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


@pytest.mark.parametrize("damage", ["flipped", "truncated", "foreign"])
def test_damaged_part_file_is_rejected_naming_it(tmp_path, damage):
    a, b = (tmp_path / name for name in "ab")
    _save_pair(tmp_path)
    if damage == "flipped":
        _flip(a / "part_1.pt")
    elif damage == "truncated":
        _truncate(a / "part_1.pt")
    else:  # equal part sizes, so only the hash (or fingerprint) tells
        shutil.copy(b / "part_1.pt", a / "part_1.pt")
    load_partition(str(a), 0, 2)  # the untouched part still loads
    with pytest.raises(PartitionMismatchError, match=r"part_1\.pt does not match .*re-partition"):
        load_partition(str(a), 1, 2)


def test_swapped_part_files_are_rejected(tmp_path):
    root, _ = _save_pair(tmp_path)
    p0, p1 = (os.path.join(root, f"part_{r}.pt") for r in (0, 1))
    os.rename(p0, p0 + ".tmp")
    os.rename(p1, p0)
    os.rename(p0 + ".tmp", p1)
    for rank in (0, 1):
        with pytest.raises(PartitionMismatchError, match=rf"part_{rank}\.pt does not match"):
            load_partition(root, rank, 2)


def test_old_format_asks_to_repartition(tmp_path):
    root, _ = _save_pair(tmp_path)
    meta_path = os.path.join(root, "meta.json")
    with open(meta_path) as f:
        meta = json.load(f)
    meta["format_version"] = 1
    del meta["part_sha256"]
    with open(meta_path, "w") as f:
        json.dump(meta, f)
    with pytest.raises(
        PartitionMismatchError, match=f"format 1.*reads format {FORMAT_VERSION}.*re-partition"
    ):
        load_partition(root, 0, 2)


def _edit_meta(root, edit):
    meta_path = os.path.join(root, "meta.json")
    with open(meta_path) as f:
        meta = json.load(f)
    edit(meta)
    with open(meta_path, "w") as f:
        json.dump(meta, f)
    return meta_path


def _set(path, value):
    def edit(meta):
        *head, last = path
        node = meta
        for key in head:
            node = node[key]
        node[last] = value

    return edit


@pytest.mark.parametrize(
    "edit,named",
    [
        (_set(["num_nodes"], 61), "num_nodes (edited)"),
        (_set(["num_edges"], 299), "num_edges (edited)"),
        (_set(["part_sizes"], [31, 29]), "part_sizes (edited)"),
        (_set(["dataset", "num_classes"], 3), "dataset.num_classes (edited)"),
        (_set(["dataset", "task"], "multiclass"), "dataset.task (edited)"),
        (lambda meta: meta.pop("part_sha256"), "part_sha256 (removed)"),
        (lambda meta: meta["part_sha256"].pop("part_1.pt"), "part_sha256.part_1.pt (removed)"),
        (
            lambda meta: meta["dataset"].clear(),
            "dataset.evaluator (removed), dataset.name (removed), dataset.num_classes (removed), "
            "dataset.task (removed)",
        ),
        (_set(["note"], "hand-made"), "note (added)"),
    ],
)
def test_every_field_of_meta_json_is_checked(tmp_path, edit, named):
    """meta.json's own fields are hashed (meta_sha256): an edited, removed or added one is refused on
    load, naming the file and the field, not trusted (sizes) nor left to fail at the first step
    (classes, task) or as a KeyError (part_sha256)."""
    ei, n = _graph()
    root = str(tmp_path / "p2")
    dataset = {"name": "g", "task": "multilabel", "num_classes": 2, "evaluator": "ogbn-proteins"}
    save_partitions(
        build_partitions(ei, n, 2, "random", node_data={"x": torch.ones(n, 1)}), root, {"dataset": dataset}
    )
    load_partition(root, 1, 2)
    meta_path = _edit_meta(root, edit)
    for rank in (0, 1):
        with pytest.raises(PartitionMismatchError) as e:
            load_partition(root, rank, 2)
        message = str(e.value)
        assert message.startswith(f"{meta_path} is not as revgnn-partition wrote it: {named}. "), message
        assert "revgnn-partition data=<data set> num_parts=2 out=" in message and "\n" not in message


def test_meta_json_without_its_hashes_asks_to_rerun_revgnn_partition(tmp_path):
    root, _ = _save_pair(tmp_path)
    meta_path = _edit_meta(root, lambda meta: meta.pop("meta_sha256"))
    with pytest.raises(PartitionMismatchError, match=re.escape(f"{meta_path} has no meta_sha256")) as e:
        load_partition(root, 0, 2)
    assert "re-run it: revgnn-partition data=<data set> num_parts=2 out=" in str(e.value)
    # the layout of the file is not part of it: re-indented, the fields still check out
    _save_pair(tmp_path)
    with open(meta_path) as f:
        meta = json.load(f)
    with open(meta_path, "w") as f:
        json.dump(dict(reversed(list(meta.items()))), f, indent=None)
    load_partition(root, 0, 2)


def test_checked_load_without_process_group(tmp_path):
    ei, n = _graph()
    save_partitions(build_partitions(ei, n, 1), str(tmp_path / "p1"))
    assert load_partition_checked(str(tmp_path / "p1"))["num_nodes"] == n
    with pytest.raises(PartitionMismatchError, match="holds 2 parts but the job runs 1"):
        load_partition_checked(_save_pair(tmp_path)[0])


def _worker_checked(rank, world_size, scenarios):
    """Runs load_partition_checked once per scenario (a root per rank);
    returns per scenario the fingerprint or the error message."""
    results = []
    for roots in scenarios:
        try:
            results.append(("ok", load_partition_checked(roots[rank])["fingerprint"]))
        except PartitionMismatchError as e:
            results.append(("error", str(e)))
    return results


def test_collective_check_rejects_on_every_rank(tmp_path):
    a, b = _save_pair(tmp_path)
    broken = str(tmp_path / "broken")
    shutil.copytree(a, broken)
    _truncate(tmp_path / "broken" / "part_1.pt")
    scenarios = [
        (a, a),  # one partitioning on both hosts
        (a, b),  # host 1 holds another partitioning
        (broken, broken),
    ]  # rank 1's file is truncated
    res = run_workers(_worker_checked, 2, scenarios, timeout_s=60, wall_s=240, threads=1)
    (ok0, mixed0, broken0), (ok1, mixed1, broken1) = [r.value for r in res]
    assert ok0 == ok1 and ok0[0] == "ok"
    for mixed in (mixed0, mixed1):
        assert mixed[0] == "error"
        assert "different partitionings" in mixed[1]
        assert f"{a}/part_0.pt" in mixed[1] and f"{b}/part_1.pt" in mixed[1]
    for failed in (broken0, broken1):  # rank 0's file is fine, it fails too
        assert failed[0] == "error"
        assert "failed on 1 of 2 workers" in failed[1]
        assert "rank 1" in failed[1] and "rank 0" not in failed[1]
        assert f"{broken}/part_1.pt does not match" in failed[1]


def _worker_load_allocations(rank, world_size, root):
    """A worker's load of its part as ``backend=sar`` runs it (the part file, its SARGraph and
    SARTask), under :class:`~revgnn.utils.memory.LargestAllocation`; returns the largest allocation,
    the peak of the bytes allocated, and the bytes of the part's tensors (all, and the largest)."""
    from revgnn.distributed.part_files import load_meta
    from revgnn.distributed.sar import SARGraph
    from revgnn.engine.backends import DDPBackend
    from revgnn.engine.sar_backend import SARTask
    from revgnn.utils.memory import LargestAllocation

    with LargestAllocation() as largest:
        part = load_partition(root, rank, world_size)
        task = SARTask(SARGraph(part, timeout_s=60), load_meta(root), DDPBackend(None), "cpu")
    sizes = [t.nbytes for t in (*part.values(), *part["node_data"].values()) if isinstance(t, torch.Tensor)]
    assert task.graph.num_edges == part["dst"].numel()
    return largest.bytes, largest.peak, sum(sizes), max(sizes)


def test_a_worker_loads_its_part_not_the_whole_graph(tmp_path):
    """At P = 4 a worker's load allocates no tensor of the whole graph's size: its largest
    allocation is no larger than its part's largest tensor (the E/P rows of edge features), and at
    its peak it holds under 1.5 times its part's bytes (the part, plus its SARGraph's compacted
    sources, E/P indices), where the part holds a quarter of the graph's."""
    from revgnn.data.node_dataset import NodeDataset

    g = torch.Generator().manual_seed(0)
    n, e, P = 2000, 64000, 4
    ds = NodeDataset(
        name="random",
        x=torch.randn(n, 16, generator=g),
        edge_index=torch.randint(0, n, (2, e), generator=g),
        edge_attr=torch.randn(e, 8, generator=g),
        y=(torch.randn(n, 8, generator=g) > 0).float(),
        split_idx={
            "train": torch.arange(0, n, 2),
            "valid": torch.arange(1, n, 4),
            "test": torch.arange(3, n, 4),
        },
        task="multilabel",
        num_classes=8,
        evaluator="ogbn-proteins",
    ).sorted_by_destination()
    whole = ds.edge_index.nbytes + ds.edge_attr.nbytes + ds.x.nbytes + ds.y.nbytes
    root = str(tmp_path / "p4")
    partition_dataset(ds, root, P, "random")
    res = run_workers(_worker_load_allocations, P, root, timeout_s=60, wall_s=240, threads=1)
    for r in res:
        largest, peak, part_bytes, part_largest = r.value
        assert part_bytes < whole / 3 and part_largest < ds.edge_attr.nbytes / 3, (r.rank, r.value, whole)
        assert largest <= part_largest, (r.rank, r.value)
        assert peak < 1.5 * part_bytes, (r.rank, r.value)


# ---- the revgnn-partition command -------------------------------------------


def _compose(overrides):
    register_partition_config()
    return compose(overrides, config_name="partition")


def test_partition_command(tmp_path):
    """End to end in a fresh process and directory: only ``out`` appears."""
    res = run_cli(
        "-m",
        "revgnn.cli.partition",
        "data=proteins_like",
        "data.num_nodes=400",
        "num_parts=2",
        "method=random",
        "out=parts/pl2",
        cwd=tmp_path,
    )
    summary = json.loads(res.stdout.strip().splitlines()[-1])
    assert summary["parts"] == 2 and sum(summary["part_sizes"]) == 400
    assert sorted(os.listdir(tmp_path)) == ["parts"]  # no Hydra outputs/
    out = tmp_path / "parts" / "pl2"
    assert sorted(os.listdir(out)) == ["meta.json", "part_0.pt", "part_1.pt"]
    meta = json.loads((out / "meta.json").read_text())
    assert meta["method"] == "random"
    config = meta["dataset"].pop("config")  # what revgnn-train backend=sar checks its data group against
    assert config["_target_"] == "revgnn.data.synthetic.proteins_like"
    assert config["num_nodes"] == 400
    assert meta["dataset"] == {
        "name": "proteins_like",
        "task": "multilabel",
        "num_classes": 112,
        "evaluator": "ogbn-proteins",
        "species_channels": 8,
    }
    part = load_partition(str(out), 0, 2)
    assert {"x", "y", "train_mask", "valid_mask", "test_mask"} <= set(part["node_data"])


def test_command_partitions_an_ogb_data_set(tmp_path, monkeypatch):
    from revgnn.testing.fake_ogb import write_fake_ogbn

    monkeypatch.setattr("builtins.input", lambda *a: pytest.fail("OGB prompted"))
    write_fake_ogbn(str(tmp_path), "ogbn-proteins", num_nodes=40)
    cfg = _compose(["data=ogbn_proteins", f"data.root={tmp_path}", "num_parts=2", f"out={tmp_path / 'p2'}"])
    stats = partition_from_config(cfg)
    assert stats["method"] == "metis" and sum(stats["part_sizes"]) == 40
    part = load_partition(str(tmp_path / "p2"), 1, 2)
    assert part["edge_attr"].size(1) == 8


@pytest.mark.parametrize(
    "overrides,error,match",
    [
        (["num_part=2", "OUT"], "ConfigCompositionException", "num_part"),
        (["num_parts=2", "method=spectral", "OUT"], "ConfigCompositionException", "metis, random"),
        (["num_parts=0", "OUT"], "ValueError", "num_parts must be >= 1"),
        (["num_parts=2"], "ValueError", "out is required"),
        (
            ["data=mol_like", "data.num_graphs=20", "num_parts=2", "OUT"],
            "ValueError",
            "SAR trains full-graph on node-level data; mol_like is graph-level",
        ),
    ],
)
def test_command_errors(overrides, error, match, tmp_path):
    out = tmp_path / "x"
    overrides = [f"out={out}" if o == "OUT" else o for o in overrides]
    with pytest.raises(Exception) as info:
        partition_from_config(_compose(overrides))
    assert type(info.value).__name__ == error
    assert match in f"{info.value} {info.value.__cause__}"  # Hydra's detail
    assert not out.exists()


def test_graph_level_data_set_is_refused(tmp_path):
    from revgnn.data.graph_dataset import mol_like

    with pytest.raises(ValueError, match="mol_like is graph-level"):
        partition_dataset(mol_like(num_graphs=20), str(tmp_path / "p"), 2)
    assert not (tmp_path / "p").exists()
