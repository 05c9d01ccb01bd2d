"""A training step written for a CUDA machine, as people write them: the device picked with
`"cuda" if torch.cuda.is_available() else "cpu"`, the model moved with `.cuda()` where CUDA exists, cuDNN's
benchmark flag, a GradScaler and autocast for "cuda", pinned batches and `torch.cuda.synchronize()`.

On a Mac every one of these is a finding (docs/trace.md, "Code that picks a device"). opscan traces it as a Mac
runs it, so a host with CUDA and one without give the same report: tests/test_device_code.py checks it under a
simulated CUDA host, bench/device_code_check.sh on a real one.

    opscan tests/targets/cuda_step.py:build_model
"""

import torch
from torch import nn

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
torch.backends.cudnn.benchmark = True
SCALER = torch.amp.GradScaler("cuda")


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.head = nn.Linear(8 * 8 * 8, 4)

    def forward(self, x):
        return self.head(torch.relu(self.conv(x)).flatten(1))


def build_model():
    model = Net()
    if torch.cuda.is_available():
        model.cuda()
    return model.to(DEVICE), (torch.randn(2, 3, 8, 8), torch.tensor([0, 3]))


def train_step(model, optimizer, inputs):
    images, labels = (t.pin_memory().to(DEVICE, non_blocking=True) for t in inputs)
    optimizer.zero_grad()
    with torch.autocast("cuda", dtype=torch.float16):
        loss = nn.functional.cross_entropy(model(images), labels)
    SCALER.scale(loss).backward()
    SCALER.step(optimizer)
    SCALER.update()
    torch.cuda.synchronize()
    return loss
