"""timm's Sapiens2 ViT (`vit_large_patch16_sapiens2`, an Eva with RmsNorm, grouped-query attention via
repeat_interleave, SwiGLU and RoPE) at a small width: 2 blocks of 64 features, a 64x64 image (random weights).

The published timm-sample board had it dual-track on torch 2.0-2.3 for two rows the releases never run: a `copy_`
inside the 2.14.1 trace's F.rms_norm (timm runs its own RmsNorm code where torch lacks F.rms_norm) left `unknown`,
and 2.0's `repeat_interleave.self_int` kernel's static callee `conj_physical`, which returns a real input as is.
"""

import torch


def build():
    from timm.models.eva import _create_eva, _sapiens2_args

    torch.manual_seed(0)
    args = _sapiens2_args(embed_dim=64, depth=2, num_heads=4, num_kv_heads=2)
    args["num_kv_heads"] = (2, 2)  # grouped-query attention: 4 query heads share 2 key/value heads
    model = _create_eva("vit_large_patch16_sapiens2", pretrained=False, **dict(args, img_size=64))
    return model, torch.randn(1, 3, 64, 64, generator=torch.Generator().manual_seed(0))
