"""A detection head's RoI pooling (torchvision.ops.roi_align) in a training step: torchvision 0.29.1 registers the
op's autograd in Python with torch.library.register_autograd (torch 2.4.0+); the torchvision paired with torch
2.0-2.3 registered it in C++, so a scan for those releases must judge the op, not call the API missing."""

import torch
import torch.nn as nn
from torchvision.ops import roi_align


class RoIHead(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.fc = nn.Linear(4 * 2 * 2, 3)

    def forward(self, image, boxes):
        features = self.conv(image)
        pooled = roi_align(features, [boxes], output_size=(2, 2), spatial_scale=1.0, sampling_ratio=2)
        return self.fc(pooled.flatten(1))


def build_model():
    torch.manual_seed(0)
    boxes = torch.tensor([[0.0, 0.0, 4.0, 4.0], [1.0, 1.0, 6.0, 7.0]])
    return RoIHead(), (torch.randn(1, 3, 8, 8), boxes)
