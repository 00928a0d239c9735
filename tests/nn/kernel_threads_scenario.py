"""Runs every revgnn kernel, forward and backward, on ``torch.set_num_threads(T)`` and saves the results
(``python kernel_threads_scenario.py T OUT.pt``); ``test_kernel_threads.py`` runs it in a fresh process
per thread count and compares the files bitwise.

The problems are large enough that every kernel splits its work among the threads: the GEN max
forward over destination nodes, its backward over channels and nodes (the SAR shard variants too), the
LayerNorm+ReLU forward over rows and its backward over blocks of rows. The second graph has
integer-valued features, so that most maxima are tied and the tied-node paths run too.
"""

import sys

import torch


def gen_max_cases():
    from torch_geometric import EdgeIndex

    n, e, c, d = 3000, 60_000, 24, 8
    for name, integer in (("random", False), ("ties", True)):
        g = torch.Generator().manual_seed(0)
        ei = torch.randint(0, n, (2, e), generator=g)
        ei = ei[:, ei[1] < n - 50]  # the last 50 nodes get no in-edges
        if integer:
            x = torch.randint(-2, 3, (n, c), generator=g).float()
            raw = torch.randint(0, 2, (ei.size(1), d), generator=g).float()
            weight = torch.randint(-1, 2, (c, d), generator=g).float()
            bias = torch.randint(-1, 2, (c,), generator=g).float()
        else:
            x = torch.randn(n, c, generator=g)
            raw = torch.rand(ei.size(1), d, generator=g)
            weight, bias = torch.randn(c, d, generator=g), torch.randn(c, generator=g)
        perm = (ei[1] * n + ei[0]).argsort()
        ei, raw = EdgeIndex(ei[:, perm], sparse_size=(n, n), sort_order="col"), raw[perm]
        yield name, ei, x, raw, weight, bias, torch.randn(n, c, generator=g)


def run(threads: int) -> dict:
    from revgnn.nn import LinearEdgeFeatures, kernels
    from revgnn.nn.gen_max import gen_max_aggregate
    from revgnn.nn.graph_input import csc
    from revgnn.nn.norm_act import layer_norm_relu

    torch.set_num_threads(threads)
    assert kernels.load("gen_max") is not None and kernels.load("layer_norm_relu") is not None, (
        "kernels did not build"
    )
    results = {}
    for name, ei, x, raw, weight, bias, grad in gen_max_cases():
        for mode in ("none", "dense", "factored"):
            inputs = [t.clone().requires_grad_() for t in (x, raw, weight, bias)]
            xx, rr, ww, bb = inputs
            if mode == "none":
                term, wrt = None, [xx]
            elif mode == "dense":
                # a fixed tensor, not linear(raw, W, b): torch's GEMM itself rounds differently on
                # different thread counts (docs/testing.md)
                term = torch.randn(raw.size(0), x.size(1), generator=torch.Generator().manual_seed(2))
                if name == "ties":
                    term = term.round()
                term.requires_grad_()
                wrt = [xx, term]
            else:
                term, wrt = LinearEdgeFeatures(rr, ww, bb), inputs
            out = gen_max_aggregate(xx, ei, term)
            results[f"gen_max/{name}/{mode}/out"] = out.detach()
            for i, gr in enumerate(torch.autograd.grad(out, wrt, grad)):
                results[f"gen_max/{name}/{mode}/grad{i}"] = gr
        # a SAR shard: the sources a fetched block of other rows
        src, _, ptr, raw_s = csc(ei, raw, x.size(0))
        block = x.flip(0).contiguous()
        kernel = kernels.load("gen_max")
        wt = weight.t().contiguous()
        max_, arg, tied, count = kernel.shard_forward(block, ptr, src, raw_s, wt, bias)
        gx, ga, gw, gb = kernel.shard_backward(
            grad, arg, tied, block, ptr, src, raw_s, wt, bias, True, True, True, True
        )
        for key, t in dict(max=max_, arg=arg, tied=tied, count=count, gx=gx, ga=ga, gw=gw, gb=gb).items():
            results[f"shard/{name}/{key}"] = t
    g = torch.Generator().manual_seed(1)
    norm = torch.nn.LayerNorm(40)
    with torch.no_grad():
        norm.weight.normal_(generator=g)
        norm.bias.normal_(generator=g)
    x = torch.randn(5000, 40, generator=g, requires_grad=True)
    mask = (torch.rand(5000, 40, generator=g) > 0.1).float() / 0.9
    out = layer_norm_relu(x, norm, mask)
    results["layer_norm_relu/out"] = out.detach()
    for i, gr in enumerate(
        torch.autograd.grad(out, [x, norm.weight, norm.bias], torch.randn(5000, 40, generator=g))
    ):
        results[f"layer_norm_relu/grad{i}"] = gr
    return results


if __name__ == "__main__":
    torch.save(run(int(sys.argv[1])), sys.argv[2])
    print("scenario done")
