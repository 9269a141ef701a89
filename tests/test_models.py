import pytest
import torch

from pfedes.models import ARCHITECTURES, ProxyExtractor, build_client_model, resolve_architecture


@pytest.mark.parametrize("arch", sorted(ARCHITECTURES))
def test_every_architecture_trains_at_32x32(arch):
    torch.manual_seed(0)
    model = build_client_model(arch, num_classes=10, proxy_dim=128, feature_dim=64)
    x = torch.randn(4, 3, 32, 32)
    z = model.backbone(x)
    logits, e_local = model.head(z), model.projection(z)
    assert logits.shape == (4, 10) and e_local.shape == (4, 128)
    (logits.sum() + e_local.sum()).backward()
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)


def test_proxy_maps_raw_input_to_d_and_ignores_input_scale():
    proxy = ProxyExtractor(proxy_dim=128).eval()
    x = torch.rand(4, 3, 32, 32)
    out = proxy(x)
    assert out.shape == (4, 128)
    # Its input normalisation makes [0, 1] and [0, 255] inputs equivalent.
    assert torch.allclose(proxy(x * 255.0), out, atol=1e-4)


def test_device_profiles_pick_different_architectures():
    profiles = {"phone": "cnn3", "gateway": "resnet_bn", "gpu-host": "vit_small"}
    assert [resolve_architecture(d, profiles) for d in profiles] == ["cnn3", "resnet_bn", "vit_small"]
    assert resolve_architecture("resnet18", profiles) == "resnet18"
    with pytest.raises(ValueError, match="unknown device or architecture 'toaster'"):
        resolve_architecture("toaster", profiles)
