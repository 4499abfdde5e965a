"""PyTorch's side of the weight import/export proofs.

  make_weights.py fixtures DIR   small torchvision/timm ResNets (same key names as the real
                                 models), saved as the tutorial's scripts save them, plus golden
                                 eval-mode logits: the committed CI fixtures.
  make_weights.py full DIR       torchvision resnet50 and timm resnet50, randomly initialised,
                                 and their golden logits (the full-size proof on the GPU machine).
  make_weights.py check DIR FILE...
                                 loads files that burn-vision exported into the matching PyTorch
                                 model with load_state_dict(strict=True) and compares its logits
                                 with the golden ones.

Every model gets random BatchNorm statistics and affine parameters (so a mapping mistake shows
in the logits) and num_batches_tracked = 1234. Golden logits are computed in float64 on the
CPU from the float32 weights; the input is x[i] = sin(0.37·i + 0.11) over the flat NCHW index,
which the Rust side computes the same way.
"""

import json
import math
import os
import sys

import torch
import torchvision
from torchvision.models.resnet import BasicBlock, Bottleneck, ResNet

SMALL_WIDTHS = [8, 16, 32, 64]


def formula_input(shape):
    n = math.prod(shape)
    i = torch.arange(n, dtype=torch.float64)
    return torch.sin(0.37 * i + 0.11).to(torch.float32).reshape(shape)


def randomise_batch_norms(model, seed):
    g = torch.Generator().manual_seed(seed)
    for m in model.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            c = m.num_features
            m.running_mean.copy_(torch.randn(c, generator=g) * 0.1)
            m.running_var.copy_(torch.rand(c, generator=g) * 1.5 + 0.5)
            m.weight.data.copy_(torch.rand(c, generator=g) + 0.5)
            m.bias.data.copy_(torch.randn(c, generator=g) * 0.1)
            m.num_batches_tracked.fill_(1234)


def small_torchvision(block, classes):
    """torchvision's ResNet built from its own classes and `_make_layer`, one block per stage
    and narrow stages: the key names of resnet18 (Basic) / resnet50 (Bottleneck)."""
    m = ResNet(block, [1, 1, 1, 1], num_classes=classes)
    m.inplanes = SMALL_WIDTHS[0]
    m.conv1 = torch.nn.Conv2d(3, SMALL_WIDTHS[0], kernel_size=7, stride=2, padding=3, bias=False)
    m.bn1 = torch.nn.BatchNorm2d(SMALL_WIDTHS[0])
    m.layer1 = m._make_layer(block, SMALL_WIDTHS[0], 1)
    m.layer2 = m._make_layer(block, SMALL_WIDTHS[1], 1, stride=2)
    m.layer3 = m._make_layer(block, SMALL_WIDTHS[2], 1, stride=2)
    m.layer4 = m._make_layer(block, SMALL_WIDTHS[3], 1, stride=2)
    m.fc = torch.nn.Linear(SMALL_WIDTHS[3] * block.expansion, classes)
    return m


def resnet10_mini(classes):
    """burn-vision's `resnet10-mini` as torchvision's classes build it: one BasicBlock per
    stage, widths 16-128, the CIFAR-style 3x3 stride-1 stem without max-pool, 1 input channel
    (for the end-to-end fine-tuning test on the bundled Fashion-MNIST images)."""
    widths = [16, 32, 64, 128]
    m = ResNet(BasicBlock, [1, 1, 1, 1], num_classes=classes)
    m.inplanes = widths[0]
    m.conv1 = torch.nn.Conv2d(1, widths[0], kernel_size=3, stride=1, padding=1, bias=False)
    m.bn1 = torch.nn.BatchNorm2d(widths[0])
    m.maxpool = torch.nn.Identity()
    m.layer1 = m._make_layer(BasicBlock, widths[0], 1)
    m.layer2 = m._make_layer(BasicBlock, widths[1], 1, stride=2)
    m.layer3 = m._make_layer(BasicBlock, widths[2], 1, stride=2)
    m.layer4 = m._make_layer(BasicBlock, widths[3], 1, stride=2)
    m.fc = torch.nn.Linear(widths[3], classes)
    return m


def small_timm(classes):
    """timm's ResNet class with one BasicBlock per stage. Its plain stem is always 64 wide
    (stem_width only shapes the deep stems), so the first stage is too."""
    import timm.models.resnet as tr

    return tr.ResNet(tr.BasicBlock, [1, 1, 1, 1], num_classes=classes, channels=(64,) + tuple(SMALL_WIDTHS[1:]))


def small_timm_vit(classes):
    """timm's VisionTransformer class at 32² (patch 8, dim 32, 2 blocks, 2 heads): the key names
    of vit_*_patch16_224. dynamic_img_size resamples the position embedding (bicubic) for other
    input sizes, as burn-vision's ViT does."""
    from timm.models.vision_transformer import VisionTransformer

    return VisionTransformer(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, num_classes=classes, dynamic_img_size=True)


def small_torchvision_vit(classes):
    """torchvision's VisionTransformer class with the same shape: vit_b_16's key names."""
    from torchvision.models.vision_transformer import VisionTransformer

    return VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=2, hidden_dim=32, mlp_dim=128, num_classes=classes)


def randomise_vit(model, seed):
    """Every LayerNorm and bias away from its initial value (timm and torchvision start them at
    1 and 0; torchvision its head at 0), so a mapping mistake shows in the logits."""
    g = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        if name.endswith("bias") or ".ln" in name or "norm" in name or name.endswith("ln.weight"):
            p.data.copy_(p.data + torch.randn(p.shape, generator=g) * 0.1)
        elif name.endswith("head.weight") and not p.data.any():  # torchvision starts its head at 0
            p.data.copy_(torch.randn(p.shape, generator=g) * 0.02)


def golden(model, shape):
    model = model.eval()
    with torch.no_grad():
        return model.double()(formula_input(shape).double()).tolist()


def save(model, path, style):
    sd = model.state_dict()
    if style == "plain":
        torch.save(sd, path)
    elif style == "ddp":  # the tutorial's checkpoint of a DDP-wrapped model
        sd = {"module." + k: v for k, v in sd.items()}
        torch.save({"epoch": 3, "state_dict": sd, "best_acc1": 0.5}, path)
    elif style == "model_key":  # timm's train.py / many repos: {"model": state_dict}
        torch.save({"model": sd, "epoch": 7}, path)
    elif style == "safetensors":
        from safetensors.torch import save_file

        save_file({k: v.contiguous() for k, v in sd.items()}, path)
    else:
        raise ValueError(style)


def build(arch, classes):
    if arch == "tv_small_basic":
        return small_torchvision(BasicBlock, classes)
    if arch == "tv_small_bottleneck":
        return small_torchvision(Bottleneck, classes)
    if arch == "timm_small_basic":
        return small_timm(classes)
    if arch == "resnet10-mini":
        return resnet10_mini(classes)
    if arch == "timm_small_vit":
        return small_timm_vit(classes)
    if arch == "tv_small_vit":
        return small_torchvision_vit(classes)
    if arch == "timm_vit_s16":
        import timm

        return timm.create_model("vit_small_patch16_224", pretrained=False, num_classes=classes)
    if arch == "tv_vit_b16":
        return torchvision.models.vit_b_16(num_classes=classes)
    if arch == "tv_resnet50":
        return torchvision.models.resnet50(num_classes=classes)
    if arch == "timm_resnet50":
        import timm

        return timm.create_model("resnet50", pretrained=False, num_classes=classes)
    raise ValueError(arch)


# name: (arch, classes, input shape, file name, save style)
FIXTURES = {
    "tv_small_basic": ("tv_small_basic", 10, [2, 3, 32, 32], "tv_small_basic.pth", "plain"),
    "tv_small_bottleneck_ddp": ("tv_small_bottleneck", 10, [2, 3, 32, 32], "tv_small_bottleneck_ddp.pth", "ddp"),
    "tv_small_bottleneck_st": ("tv_small_bottleneck", 10, [2, 3, 32, 32], "tv_small_bottleneck.safetensors", "safetensors"),
    "timm_small_basic": ("timm_small_basic", 10, [2, 3, 32, 32], "timm_small_basic.pth", "model_key"),
    "tv_resnet10_mini": ("resnet10-mini", 10, [2, 1, 28, 28], "tv_resnet10_mini.pth", "plain"),
    "timm_small_vit": ("timm_small_vit", 10, [2, 3, 32, 32], "timm_small_vit.pth", "plain"),
    "timm_small_vit_48px": ("timm_small_vit", 10, [2, 3, 48, 48], "timm_small_vit.pth", "plain"),
    "tv_small_vit": ("tv_small_vit", 10, [2, 3, 32, 32], "tv_small_vit.safetensors", "safetensors"),
}
FULL = {
    "tv_resnet50": ("tv_resnet50", 1000, [2, 3, 224, 224], "tv_resnet50.pth", "plain"),
    "timm_resnet50": ("timm_resnet50", 1000, [2, 3, 224, 224], "timm_resnet50.safetensors", "safetensors"),
    "timm_vit_s16": ("timm_vit_s16", 1000, [2, 3, 224, 224], "timm_vit_s16.pth", "plain"),
    "tv_vit_b16": ("tv_vit_b16", 1000, [2, 3, 224, 224], "tv_vit_b16.safetensors", "safetensors"),
}


def make(entries, out):
    os.makedirs(out, exist_ok=True)
    manifest = {"input": "sin(0.37*i + 0.11), flat NCHW index i, float32", "torch": torch.__version__, "models": {}}
    made = {}  # file -> model: entries sharing a file (another input size) share its weights
    for seed, (name, (arch, classes, shape, file, style)) in enumerate(entries.items()):
        if file not in made:
            torch.manual_seed(seed)
            model = build(arch, classes)
            randomise_batch_norms(model, seed)
            if "vit" in arch:
                randomise_vit(model, seed)
            save(model, os.path.join(out, file), style)
            made[file] = model
            print(f"{name}: {file} ({os.path.getsize(os.path.join(out, file))} bytes, {style})")
        manifest["models"][name] = {"arch": arch, "classes": classes, "input_shape": shape, "file": file, "style": style, "logits": golden(made[file], shape)}
    with open(os.path.join(out, "golden.json"), "w") as f:
        json.dump(manifest, f)


def load_any(path):
    if path.endswith(".safetensors"):
        from safetensors.torch import load_file

        return load_file(path)
    return torch.load(path, map_location="cpu", weights_only=True)


def check(out, files):
    """FILE is NAME=PATH: the golden entry NAME's architecture loads PATH strictly."""
    manifest = json.load(open(os.path.join(out, "golden.json")))
    worst = 0.0
    for item in files:
        name, path = item.split("=", 1)
        entry = manifest["models"][name]
        model = build(entry["arch"], entry["classes"])
        model.load_state_dict(load_any(path), strict=True)
        nbt = {int(b.item()) for n, b in model.named_buffers() if n.endswith("num_batches_tracked")}
        got = torch.tensor(golden(model, entry["input_shape"]))
        want = torch.tensor(entry["logits"])
        err = ((got - want).abs().max() / want.abs().max()).item()
        worst = max(worst, err)
        print(f"check {name} <- {path}: strict load ok, num_batches_tracked {sorted(nbt)}, max |Δ|/max|logit| = {err:.3e}")
    print(f"check worst {worst:.3e}")
    sys.exit(0 if worst <= 1e-4 else 1)


def torch_gpu(out):
    """PyTorch's own f32 GPU logits against the float64 golden ones: what a GPU reaches with
    TF32 off (cuDNN and matmul), with cudnn.benchmark on and off, NCHW and channels_last."""
    manifest = json.load(open(os.path.join(out, "golden.json")))
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    for name, entry in manifest["models"].items():
        model = build(entry["arch"], entry["classes"])
        model.load_state_dict(load_any(os.path.join(out, entry["file"])) if entry["style"] != "ddp" else {k[7:]: v for k, v in torch.load(os.path.join(out, entry["file"]), weights_only=True)["state_dict"].items()})
        model = model.cuda().eval()
        want = torch.tensor(entry["logits"])
        x = formula_input(entry["input_shape"]).cuda()
        for bench in (False, True):
            torch.backends.cudnn.benchmark = bench
            for cl in (False, True):
                m = model.to(memory_format=torch.channels_last) if cl else model
                xi = x.to(memory_format=torch.channels_last) if cl else x
                with torch.no_grad():
                    got = m(xi).double().cpu()
                err = ((got - want).abs().max() / want.abs().max()).item()
                print(f"| {name} | PyTorch GPU f32, TF32 off, benchmark={bench}, {'channels_last' if cl else 'NCHW'} | {err:.2e} |")


if __name__ == "__main__":
    mode, out = sys.argv[1], sys.argv[2]
    if mode == "fixtures":
        make(FIXTURES, out)
    elif mode == "full":
        make(FULL, out)
    elif mode == "torch_gpu":
        torch_gpu(out)
    elif mode == "check":
        check(out, sys.argv[3:])
    else:
        sys.exit(__doc__)
