"""Node orders (revgnn.data.ordering): a permutation, a narrower bandwidth, and a relabelled data set
that is the same graph, the same splits and the same model outputs once mapped back."""

import pytest
import torch

from revgnn.data.ordering import bandwidth, node_order, original_ids, reorder
from revgnn.data.synthetic import proteins_like


def shuffled_grid(side=20, seed=0):
    """A ``side x side`` grid (both directions) under a random relabelling: bandwidth ~N, while an
    order by levels has bandwidth ~side."""
    ids = torch.arange(side * side).view(side, side)
    pairs = torch.cat(
        [
            torch.stack([ids[:, :-1].flatten(), ids[:, 1:].flatten()]),
            torch.stack([ids[:-1].flatten(), ids[1:].flatten()]),
        ],
        1,
    )
    edges = torch.cat([pairs, pairs.flip(0)], 1)
    perm = torch.randperm(side * side, generator=torch.Generator().manual_seed(seed))
    return perm[edges], side * side


@pytest.mark.parametrize("method", ["rcm", "degree", "none"])
def test_a_permutation(method):
    edges, n = shuffled_grid()
    order = node_order(edges, n + 5, method)  # 5 isolated nodes too
    assert order.dtype == torch.int64 and torch.equal(order.sort().values, torch.arange(n + 5))


def test_rcm_narrows_the_bandwidth():
    edges, n = shuffled_grid(side=20)
    order = node_order(edges, n, "rcm")
    new_id = torch.empty_like(order)
    new_id[order] = torch.arange(n)
    assert bandwidth(edges) > 300  # random labels: endpoints anywhere
    assert bandwidth(new_id[edges]) <= 2 * 20  # levels of a grid: about one side apart


def test_degree_puts_hubs_first():
    edges = torch.tensor([[0, 1, 2, 3, 0, 1], [3, 3, 3, 2, 2, 1]])
    assert node_order(edges, 4, "degree").tolist() == [3, 2, 1, 0]


def test_bad_input():
    with pytest.raises(ValueError, match="choose one of none, rcm, degree"):
        node_order(torch.zeros(2, 0, dtype=torch.long), 3, "metis!")
    with pytest.raises(ValueError, match=r"outside \[0, 3\)"):
        node_order(torch.tensor([[0, -1], [1, 2]]), 3, "rcm")


def test_reorder_is_the_same_graph_and_maps_back():
    ds = proteins_like(num_nodes=300, avg_degree=6, window=4, seed=1)
    ref = proteins_like(num_nodes=300, avg_degree=6, window=4, seed=1)
    reorder(ds, "rcm")
    reorder(ds, "degree")  # composed: still maps to the ids as loaded
    orig = original_ids(ds)
    assert torch.equal(ds.x, ref.x[orig]) and torch.equal(ds.y, ref.y[orig])
    for key in ref.split_idx:
        assert torch.equal(orig[ds.split_idx[key]].sort().values, ref.split_idx[key].sort().values)
    # the same multiset of (source, destination, features) in original ids; sorted by destination
    assert bool((ds.edge_index[1][1:] >= ds.edge_index[1][:-1]).all())

    def edges_of(ei, attr):
        rows = torch.cat([ei.t().double(), attr.double()], 1)
        return rows[torch.from_numpy(__import__("numpy").lexsort(rows.t().flip(0).numpy()))]

    assert torch.equal(edges_of(orig[ds.edge_index], ds.edge_attr), edges_of(ref.edge_index, ref.edge_attr))


def test_model_outputs_map_back():
    """A RevGNN in float64 on the reordered graph gives, mapped back, the original graph's outputs (to
    summation order: 1e-12)."""
    from revgnn.models import create_model

    ref = proteins_like(num_nodes=200, avg_degree=6, window=4, seed=2)
    ds = reorder(proteins_like(num_nodes=200, avg_degree=6, window=4, seed=2), "rcm")
    torch.manual_seed(0)
    model = (
        create_model(
            "revgnn_proteins_like",
            num_layers=3,
            in_channels=ref.in_channels,
            edge_channels=ref.edge_channels,
            out_channels=ref.num_classes,
            species_channels=ref.species_channels,
        )
        .double()
        .eval()
    )
    with torch.no_grad():
        a = model(ref.x.double(), ref.edge_index, ref.edge_attr.double())
        b = model(ds.x.double(), ds.edge_index, ds.edge_attr.double())
    back = torch.empty_like(b)
    back[original_ids(ds)] = b
    assert ((back - a).abs().max() / a.abs().max()).item() <= 1e-12


def _model(ds, **options):
    from revgnn.models import create_model

    torch.manual_seed(0)
    return create_model(
        "revgnn_proteins_like",
        num_layers=3,
        hidden_channels=16,
        in_channels=ds.in_channels,
        edge_channels=ds.edge_channels,
        out_channels=ds.num_classes,
        species_channels=ds.species_channels,
        **options,
    ).double()


def test_in_original_order_is_the_inverse_and_checks_rows():
    from revgnn.data.ordering import in_original_order

    ref = proteins_like(num_nodes=300, avg_degree=6, window=4, seed=3)
    ds = proteins_like(num_nodes=300, avg_degree=6, window=4, seed=3, node_order="degree")
    assert torch.equal(in_original_order(ds, ds.x), ref.x) and torch.equal(in_original_order(ds, ds.y), ref.y)
    assert in_original_order(ref, ref.x) is ref.x  # no order applied: the tensor itself
    with pytest.raises(ValueError, match="299 rows for the 296 nodes"):
        in_original_order(ds, torch.zeros(299, 2))
    with pytest.raises(ValueError, match="choose one of none, rcm, degree"):
        reorder(ds, "metis")


@pytest.mark.parametrize("method", ["rcm", "degree"])
def test_a_loader_option_applied_once_at_load(method):
    """``proteins_like(node_order=...)`` is the generated graph relabelled once (the same as
    :func:`reorder` after loading), and ``none`` is bitwise the data set as before."""
    plain = dict(num_nodes=300, avg_degree=6, window=4, seed=4)
    ds = proteins_like(**plain, node_order=method)
    by_hand = reorder(proteins_like(**plain), method)
    for key in ("x", "y", "edge_index", "edge_attr"):
        assert torch.equal(getattr(ds, key), getattr(by_hand, key)), key
    assert torch.equal(original_ids(ds), original_ids(by_hand)) and ds.info["node_order_method"] == method
    none = proteins_like(**plain, node_order="none")
    assert "node_order" not in none.info and torch.equal(none.edge_index, proteins_like(**plain).edge_index)


def test_loss_gradients_and_scores_equal_in_float64():
    """Full-graph training loss, every parameter's gradient (no dropout: its masks are drawn per node
    id) and the OGB scores of the float64 logits: equal with and without the order, to summation
    order (1e-12 relative)."""
    from revgnn.engine.inference import Scorer
    from revgnn.engine.tasks import task_loss

    plain = dict(num_nodes=320, avg_degree=6, window=4, seed=5)
    results = []
    for order in ("none", "rcm"):
        ds = proteins_like(**plain, node_order=order)
        model = _model(ds, dropout=0.0).train()
        logits = model(ds.x.double(), ds.edge_index, ds.edge_attr.double())
        train = ds.split_idx["train"]
        loss = task_loss(logits[train], ds.y[train], ds.task)
        loss.backward()
        grads = [p.grad.clone() for p in model.parameters()]
        results.append((loss.detach(), grads, Scorer.for_dataset(ds)(logits.detach())))
    (loss_a, grads_a, scores_a), (loss_b, grads_b, scores_b) = results
    assert abs(loss_a - loss_b) <= 1e-12 * abs(loss_a)
    for a, b in zip(grads_a, grads_b):
        assert (a - b).abs().max() <= 1e-12 * max(a.abs().max(), 1e-300)
    assert scores_a.keys() == scores_b.keys()
    for split in scores_a:
        assert abs(scores_a[split] - scores_b[split]) <= 1e-12, split


def test_node_task_logits_map_back():
    """The evaluation's full-graph logits (one view of one part: deterministic) of a reordered data
    set, mapped back with ``in_original_order``, are the original data set's."""
    from omegaconf import OmegaConf

    from revgnn.data.ordering import in_original_order
    from revgnn.engine.tasks import NodeTask

    plain = dict(num_nodes=300, avg_degree=6, window=4, seed=6)
    tc = OmegaConf.create(dict(train_parts=1, parts_per_step=1, eval_views=1, eval_parts=1))
    logits = []
    for order in ("none", "rcm"):
        ds = proteins_like(**plain, node_order=order)
        task = NodeTask(ds, tc)
        out = task.node_logits(_model(ds, dropout=0.1).float(), torch.Generator().manual_seed(0), "cpu")
        logits.append(in_original_order(ds, out))
    # float32, the same sums in another order: per layer each logit sums <= ~12 neighbours and 16
    # channels, 4 layers with the head: (12 + 16) * 4 * 6e-8 ~ 7e-6 of the logits' scale at most
    assert (logits[0] - logits[1]).abs().max() <= 1e-5 * logits[0].abs().max()


def test_pyg_node_data_reordered_and_graph_level_refused():
    from torch_geometric.data import Data

    from revgnn.data.pyg_data import from_pyg
    from revgnn.errors import ConfigError

    edges, n = shuffled_grid(side=16, seed=2)
    data = Data(x=torch.randn(n, 3), edge_index=edges, y=torch.arange(n) % 3)
    ref = from_pyg(data, "grid")
    ds = from_pyg(data, "grid", node_order="rcm")
    orig = original_ids(ds)
    assert torch.equal(ds.x, ref.x[orig]) and torch.equal(ds.y, ref.y[orig])
    assert bandwidth(ds.edge_index) <= 2 * 16 < bandwidth(ref.edge_index)
    for key in ref.split_idx:  # the same random split, drawn before the relabelling
        assert torch.equal(orig[ds.split_idx[key]].sort().values, ref.split_idx[key])
    graphs = [
        Data(x=torch.randn(4, 2), edge_index=torch.tensor([[0, 1], [1, 2]]), y=torch.tensor([i % 2]))
        for i in range(6)
    ]
    with pytest.raises(ConfigError, match="graph-level .* data.node_order=rcm relabels the nodes"):
        from_pyg(graphs, "mols", node_order="rcm")


def test_ogb_loader_reorders_after_preparing_features(tmp_path, monkeypatch):
    """``load_ogbn(node_order=...)`` on a raw OGB directory: the graph as loaded without it, relabelled
    (proteins' features, summed over the original edges, follow their nodes)."""
    from revgnn.data.ogbn import load_ogbn
    from revgnn.testing.fake_ogb import write_fake_ogbn

    monkeypatch.setattr("builtins.input", lambda *a: pytest.fail("OGB prompted"))
    write_fake_ogbn(str(tmp_path), "ogbn-proteins", num_nodes=60, avg_degree=4)
    ref = load_ogbn("ogbn-proteins", str(tmp_path))
    ds = load_ogbn("ogbn-proteins", str(tmp_path), node_order="rcm")
    orig = original_ids(ds)
    assert not torch.equal(orig, torch.arange(ds.num_nodes))
    assert torch.equal(ds.x, ref.x[orig]) and torch.equal(ds.y, ref.y[orig])
    assert torch.equal(orig[ds.edge_index].sort(1).values, ref.edge_index.sort(1).values)


def test_sar_part_files_name_original_ids(tmp_path):
    """A reordered data set partitioned for SAR: each part's ``node_ids`` are ids as loaded, so its
    node tensors are the original data set's rows at them."""
    from revgnn.distributed.partition import partition_dataset

    plain = dict(num_nodes=300, avg_degree=6, window=4, seed=7)
    ref, ds = proteins_like(**plain), proteins_like(**plain, node_order="rcm")
    partition_dataset(ds, str(tmp_path), 3, "random")
    seen = []
    for p in range(3):
        part = torch.load(tmp_path / f"part_{p}.pt", weights_only=True)
        assert torch.equal(part["node_data"]["x"], ref.x[part["node_ids"]])
        seen.append(part["node_ids"])
    assert torch.equal(torch.cat(seen).sort().values, torch.arange(ref.num_nodes))


def test_a_bad_order_is_one_line_before_the_data_loads(tmp_path):
    from conftest import run_cli

    out = run_cli(
        "-m",
        "revgnn.train",
        "data.node_order=metis",
        f"output_dir={tmp_path / 'run'}",
        cwd=tmp_path,
        expect=2,
    )
    assert (
        out.output.strip()
        == "revgnn-train: data.node_order must be one of 'none', 'rcm', 'degree', got 'metis'"
    )
    assert not (tmp_path / "run").exists()


def test_evaluate_saves_predictions_in_original_ids(tmp_path, capsys):
    """A run trained with ``data.node_order=rcm``; ``revgnn-evaluate --predictions`` (one view of one
    part: the full graph) saves logits whose row ``i`` is node ``i`` as generated: those of the
    checkpoint's model on the graph without the order."""
    import json

    from conftest import TINY_RUN, compose

    from revgnn.cli.evaluate import main as evaluate
    from revgnn.cli.train import train
    from revgnn.engine.checkpoint import load_trained
    from revgnn.engine.loop import build_model
    from revgnn.engine.tasks import shapes

    cfg = compose([*TINY_RUN, "data.node_order=rcm"])
    cfg.output_dir = str(tmp_path / "run")
    train(cfg)
    saved = tmp_path / "pred.pt"
    best = str(tmp_path / "run" / "best.pt")
    evaluate([best, "--views", "1", "--parts", "1", "--predictions", str(saved)])
    scores = json.loads(capsys.readouterr().out)
    trained = load_trained(best)
    plain = {k: v for k, v in trained.config.data.items() if k not in ("_target_", "node_order")}
    ref = proteins_like(**plain)
    model = build_model(trained.config.model, shapes(ref))
    model.load_state_dict(trained.model_state)
    with torch.no_grad():
        expect = model.eval()(ref.x, ref.edge_index, ref.edge_attr)
    pred = torch.load(saved, weights_only=True)
    assert pred.shape == expect.shape and pred.dtype == torch.float32
    # float32, the same sums in another order (2 layers x 8 channels): a few ulps of the scale
    assert (pred - expect).abs().max() <= 1e-5 * expect.abs().max()
    from revgnn.engine.inference import Scorer

    assert abs(Scorer.for_dataset(ref)(pred)["valid"] - scores["valid"]) <= 1e-9
