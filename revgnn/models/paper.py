"""The paper's facts the zoo's variants are built from, in one place: data shapes, citations and the
sources of the published scores (each variant's settings and score live in its registration,
:func:`~revgnn.models.register_model`)."""

#: ogbn-proteins shapes: 8 summed edge features + 8-way species one-hot in, 8-d edge features,
#: 112 binary tasks out.
PROTEINS = dict(in_channels=16, edge_channels=8, out_channels=112, species_channels=8)

#: ogbg-molhiv shapes: 9 categorical atom features, 3 categorical bond features, 1 binary task.
MOLHIV = dict(in_channels=9, edge_channels=3, out_channels=1)

#: The paper of RevGNN, WT-RevGNN and DEQ-GNN.
LI_2021 = "Li et al., Training Graph Neural Networks with 1000 Layers, ICML 2021"

#: Where the paper's 112-layer models (ResGNN, RevGNN, WT-RevGNN, DEQ-GNN; 64/80/224 channels) are
#: compared.
ABLATION_112 = "Li et al. 2021, 112-layer comparison on ogbn-proteins"
