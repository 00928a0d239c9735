"""Test-wide settings."""
import torch

# The tests use tiny graphs: one thread avoids OpenMP spin-waiting, which makes
# small ops 10-100x slower when the two cores are shared with other processes.
torch.set_num_threads(1)
