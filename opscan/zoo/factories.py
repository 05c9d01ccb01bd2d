"""Factories the zoo's families name as targets (`opscan.zoo.factories:NAME`): each returns `(model, inputs)`
with random weights, nothing downloaded (HF_HUB_OFFLINE=1 is enough).

- `torchvision(name, kind)`: torchvision's own builder at its real size (its default number of classes), with
  small inputs for its kind: classification and segmentation 2x3x224x224 (the size ViT requires; 299 for
  Inception v3, whose aux head needs it), video 1x3x8x112x112 (16x224x224 for MViT, Swin3D and S3D, which need it),
  optical flow two 1x3x128x128 frames, detection two 128x128 images with two boxes each (the loss needs targets:
  _Detection; masks for Mask R-CNN, keypoints for Keypoint R-CNN).
- `timm_model(name)`: timm.create_model at full size, inputs at its pretrained config's input size.
- `hf(...)`, `hf_auto(model_type, head)`: transformers models from small configs, with the inputs and labels their
  task takes, so `outputs.loss` is the loss (bench/zoo_models.py's `hf` is this one).
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn

# Small-config keys (every config that has one gets it): 2 layers, width 32, 2 heads of 16, vocabulary 128
SMALL = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 2,
         "intermediate_size": 64, "vocab_size": 128, "max_position_embeddings": 64, "head_dim": 16,
         "n_embd": 32, "n_layer": 2, "n_head": 2, "n_positions": 64, "n_inner": 64, "d_model": 32, "num_layers": 2,
         "num_heads": 2, "d_ff": 64, "d_kv": 16, "encoder_layers": 1, "decoder_layers": 1,
         "encoder_attention_heads": 2, "decoder_attention_heads": 2, "encoder_ffn_dim": 64, "decoder_ffn_dim": 64,
         "image_size": 32, "patch_size": 8, "num_labels": 3}
HEADS = {"causal-lm": ("AutoModelForCausalLM", "lm"), "masked-lm": ("AutoModelForMaskedLM", "lm"),
         "classify": ("AutoModelForSequenceClassification", "classify"),
         "image": ("AutoModelForImageClassification", "image")}


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# ---------------------------------------------------------------- torchvision


class _Detection(nn.Module):
    """A torchvision detector in training: forward(images, boxes, labels[, extra]) -> the sum of its losses
    (`extra`: per-image masks for Mask R-CNN, keypoints for Keypoint R-CNN, named by `extra_key`)."""

    def __init__(self, detector: nn.Module, extra_key: str | None = None):
        super().__init__()
        self.detector = detector
        self.extra_key = extra_key

    def forward(self, images, boxes, labels, extra=None):
        targets = [{"boxes": b, "labels": lab} for b, lab in zip(boxes, labels)]
        if extra is not None:
            for target, value in zip(targets, extra):
                target[self.extra_key] = value
        return sum(self.detector(list(images), targets).values())


def detection(name: str = "fasterrcnn_mobilenet_v3_large_320_fpn", size: int = 128, num_classes: int = 3):
    """A torchvision detector (random weights, no pretrained backbone) and two images with two boxes each; Mask
    R-CNN also gets a mask per box (ones inside it), Keypoint R-CNN 17 visible keypoints per box (inside it)."""
    import torchvision

    detector = getattr(torchvision.models.detection, name)(weights=None, weights_backbone=None,
                                                            num_classes=num_classes)
    images = torch.rand(2, 3, size, size, generator=_gen())
    box = [[8.0, 8.0, 60.0, 60.0], [30.0, 40.0, 100.0, 110.0]]
    boxes = torch.tensor([box] * 2)
    labels = torch.tensor([[1, 2], [2, 1]])
    if name.startswith("maskrcnn"):
        masks = torch.zeros(2, 2, size, size, dtype=torch.uint8)
        for i, (x0, y0, x1, y1) in enumerate(box):
            masks[:, i, int(y0):int(y1), int(x0):int(x1)] = 1
        return _Detection(detector, "masks"), (images, boxes, labels, masks)
    if name.startswith("keypointrcnn"):
        points = torch.linspace(0.2, 0.8, 17)
        keypoints = torch.stack([torch.stack([x0 + (x1 - x0) * points, y0 + (y1 - y0) * points, torch.ones(17)], 1)
                                 for x0, y0, x1, y1 in box])
        return _Detection(detector, "keypoints"), (images, boxes, labels, torch.stack([keypoints] * 2))
    return _Detection(detector), (images, boxes, labels)


@contextlib.contextmanager
def fake_safe_init():
    """nn.init.trunc_normal_ that works on fake tensors. torch 2.14's samples by rejection until
    `mask.any()` is False (torch/nn/init.py, _no_grad_trunc_normal_, 2.14.1 lines 111-125): a value fake tensors
    do not have, so building ConvNeXt, ViT, Swin or MaxViT under them fails. Initial values do not matter to a
    fake tensor (and the build is not part of the traced step), so a fake one is filled with normal_ instead."""
    from torch._subclasses.fake_tensor import is_fake

    original = nn.init.trunc_normal_

    def trunc_normal_(tensor, mean=0.0, std=1.0, a=-2.0, b=2.0, generator=None):
        if is_fake(tensor):
            with torch.no_grad():
                return tensor.normal_(mean, std)
        return original(tensor, mean, std, a, b, generator=generator)

    nn.init.trunc_normal_ = trunc_normal_
    try:
        yield
    finally:
        nn.init.trunc_normal_ = original


def torchvision(name: str, kind: str = "classification"):
    """torchvision's `name` at its real size with random weights, and small inputs for its `kind`."""
    import torchvision as tv

    if kind == "detection":
        return detection(name, num_classes=91)
    with fake_safe_init():
        model = tv.models.get_model(name, weights=None,
                                    **({"weights_backbone": None} if kind == "segmentation" else {}))
    g = _gen()
    if kind == "video":
        frames, side = (16, 224) if name.startswith(("mvit", "swin3d", "s3d")) else (8, 112)
        return model, torch.randn(1, 3, frames, side, side, generator=g)
    if kind == "optical_flow":
        return model, (torch.randn(1, 3, 128, 128, generator=g), torch.randn(1, 3, 128, 128, generator=g))
    side = 299 if name == "inception_v3" else 224  # Inception v3's aux head needs 299 (torchvision's docs)
    return model, torch.randn(2, 3, side, side, generator=g)


# ---------------------------------------------------------------- timm


def timm_model(name: str, batch: int = 2):
    """timm's `name` at full size (random weights), inputs at its pretrained config's input size."""
    import timm

    with fake_safe_init(), _python_drop_path_rates():
        model = timm.create_model(name, pretrained=False)
    size = tuple((getattr(model, "pretrained_cfg", None) or {}).get("input_size") or (3, 224, 224))
    return model, torch.randn(batch, *size, generator=_gen())


def _drop_path_rates(drop_path_rate: float, depths, stagewise: bool = False):
    """timm.layers.calculate_drop_path_rates in plain Python: the same linear schedule as its
    `torch.linspace(0, rate, n).tolist()` (timm 1.0.31 layers/drop.py:193-231), without a tensor whose values fake
    tensors would not have (`drop_path > 0.` on them stops the build of most timm models)."""
    total = depths if isinstance(depths, int) else sum(depths)
    rates = [drop_path_rate * i / (total - 1) if total > 1 else 0.0 for i in range(total)]
    if isinstance(depths, int):
        if stagewise:
            raise ValueError("stagewise=True requires depths to be a list of stage depths")
        return rates
    if not stagewise:
        return rates
    starts = [sum(depths[:i]) for i in range(len(depths))]
    return [rates[start:start + depth] for start, depth in zip(starts, depths)]


@contextlib.contextmanager
def _python_drop_path_rates():
    """Every timm module's `calculate_drop_path_rates` (each imports it by name) is _drop_path_rates inside."""
    import sys

    found = [(m, m.calculate_drop_path_rates) for n, m in list(sys.modules.items())
             if n.startswith("timm.") and hasattr(m, "calculate_drop_path_rates")]
    for module, _ in found:
        module.calculate_drop_path_rates = _drop_path_rates
    try:
        yield
    finally:
        for module, original in found:
            module.calculate_drop_path_rates = original


# ---------------------------------------------------------------- Hugging Face transformers


def hf(arch: str, config: dict, task: str = "lm", batch: int = 2, seq: int = 16, vocab: int = 128,
       image: int = 32, channels: int = 3, audio: int = 1600, labels: int = 3, config_class: str | None = None):
    """`transformers.<arch>` built from `<Arch>Config(**config)` (or `config_class`) with random weights, and
    the inputs its task takes: token ids (lm, seq2seq, classify), pixel values (image), or raw audio (ctc,
    speech-seq2seq: log-mel features), labels included so `outputs.loss` is the loss."""
    import transformers

    model_class = getattr(transformers, arch)
    config_class = getattr(transformers, config_class) if config_class else model_class.config_class
    model = model_class(config_class(**config))
    return model, _hf_inputs(task, batch, seq, vocab, image, channels, audio, labels, config)


def hf_auto(model_type: str, head: str = "causal-lm"):
    """The auto-model class of `head` for `model_type` (e.g. "llama", "causal-lm"), from its default config
    shrunk by SMALL (only the keys the config has), with the inputs of its task."""
    import transformers

    auto_class, task = HEADS[head]
    default = transformers.AutoConfig.for_model(model_type)
    small = {k: v for k, v in SMALL.items() if k in default.to_dict()}
    small["num_labels"] = 3  # every config takes it (to_dict() shows id2label instead); the labels are 0-2
    config = transformers.AutoConfig.for_model(model_type, **small)
    model = getattr(transformers, auto_class).from_config(config)
    vocab = getattr(config, "vocab_size", None) or 128
    image = getattr(config, "image_size", 32)
    image = image if isinstance(image, int) else 32
    return model, _hf_inputs(task, 2, 16, min(vocab, 128), image, getattr(config, "num_channels", 3), 1600, 3, {})


def _hf_inputs(task, batch, seq, vocab, image, channels, audio, labels, config):
    g = _gen()
    ids = torch.randint(4, vocab, (batch, seq), generator=g)
    if task == "lm":
        return {"input_ids": ids, "labels": ids.clone()}
    if task == "seq2seq":
        return {"input_ids": ids, "labels": torch.randint(4, vocab, (batch, seq // 2), generator=g)}
    if task == "classify":
        return {"input_ids": ids, "labels": torch.randint(0, labels, (batch,), generator=g)}
    if task == "image":
        return {"pixel_values": torch.randn(batch, channels, image, image, generator=g),
                "labels": torch.randint(0, labels, (batch,), generator=g)}
    return _hf_multimodal(task, batch, seq, vocab, image, channels, audio, config, ids, g)


def _hf_multimodal(task, batch, seq, vocab, image, channels, audio, config, ids, g):
    if task == "clip":
        return {"input_ids": ids, "pixel_values": torch.randn(batch, channels, image, image, generator=g),
                "return_loss": True}
    if task == "ctc":
        return {"input_values": torch.randn(batch, audio, generator=g),
                "labels": torch.randint(1, vocab, (batch, 4), generator=g)}
    if task == "speech-seq2seq":
        mels = config.get("num_mel_bins", 80)
        frames = 2 * config.get("max_source_positions", 1500)
        return {"input_features": torch.randn(batch, mels, frames, generator=g),
                "labels": torch.randint(4, vocab, (batch, seq // 2), generator=g)}
    raise ValueError(f"unknown task {task!r}")
