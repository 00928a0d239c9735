"""Helpers for testing code that uses revgnn (as :mod:`torch_geometric.testing`): raw OGB-layout data
sets written on the spot, loaded through OGB's real code; local worker processes with a process group
(:mod:`revgnn.testing.workers`, imported on use: it needs ``torch.distributed``)."""

from revgnn.testing.fake_ogb import write_fake_ogbg, write_fake_ogbn

__all__ = ["write_fake_ogbn", "write_fake_ogbg"]
