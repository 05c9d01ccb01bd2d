"""Accept stage: `opscan accept`, the acceptance run of the real model on a target device against a reference."""
