"""Graph stage: the step as a networkx graph, the bytes that cross CPU<->MPS, and the lane they help decide.

build.py (the graph of MPS-view calls and tensors), transfers.py (copies per call, as PyTorch makes them),
views.py (module quotient, each finding's neighbourhood, the report's `graph` section), lanes.py (the lane
reasons that come from transfers).
"""
