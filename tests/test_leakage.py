"""The leakage benchmark (benchmarks/leakage.py): its attack really inverts gradients, its scores
are torchmetrics', what it attacks is exactly the method's shared entries (and the attacker's
model of the client's loss is exact), and its local-DP row really clips and noises the update."""

import copy
import json
import sys
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.nn import functional as F

pytest.importorskip("torchmetrics",
                    reason="the leakage benchmark scores with torchmetrics: pip install -e '.[leakage]'")
pytest.importorskip("scipy", reason="the leakage benchmark matches images with scipy: pip install -e '.[leakage]'")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import leakage  # noqa: E402

from pfedes.client_round import load_node_data  # noqa: E402
from pfedes.methods import method_of  # noqa: E402
from pfedes.data import to_input  # noqa: E402
from pfedes.filters import shared_keys  # noqa: E402

METHODS = {m.name: m for m in leakage.methods([0.1])}


def one_step_setup(name: str, batch: int = 4):
    """(cfg, data, sent, the B images of the step) for the one-step case on the embedded sample."""
    method = METHODS[name]
    extra = [f"train.batch_size={max(batch, 2)}", "train.augment=false"]
    if name.startswith("pfedes"):
        extra.append("strategy.proxy_epochs=0")
    cfg = leakage.make_cfg(method, "embedded", 0, 3, 120, extra)
    data = load_node_data(cfg, "embedded", 0, 3)
    return method, cfg, leakage.global_state(cfg), leakage.one_step_batch(data, batch, 0)


def test_attack_recovers_an_image_from_a_tiny_models_single_step(small_data):
    torch.manual_seed(0)
    truth = F.avg_pool2d(small_data.x_train[:1].float() / 255, 2)  # one real image, 16 x 16
    label = small_data.y_train[:1]
    net = nn.Sequential(nn.Flatten(), nn.Linear(3 * 16 * 16, 32), nn.Sigmoid(), nn.Linear(32, 10))
    client = copy.deepcopy(net)  # the client steps its copy; the server keeps the state it sent
    optimizer = torch.optim.SGD(client.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
    F.cross_entropy(client(truth), label).backward()
    optimizer.step()
    target = [-(new.detach() - old.detach()) / 0.1 - 5e-4 * old.detach()
              for new, old in zip(client.parameters(), net.parameters())]
    params = list(net.parameters())

    def gradient(x, y, free, create_graph=False):
        return list(torch.autograd.grad(F.cross_entropy(net(x), y), params, create_graph=create_graph))

    box = (torch.zeros(1, 3, 1, 1), torch.ones(1, 3, 1, 1))
    x, cost = leakage.invert(gradient, target, label, (1, 3, 16, 16), iterations=200, restarts=1,
                             tv=1e-4, seed=0, box=box)
    psnr = float(leakage.score(x, truth)["psnr"].mean())
    assert cost < 1e-3 and psnr > 30, (cost, psnr)
    blind = float(leakage.score(torch.full_like(truth, 0.5), truth)["psnr"].mean())
    assert psnr > blind + 15


def test_scores_are_torchmetrics_psnr_and_ssim_of_the_best_match(small_data):
    from torchmetrics.functional.image import peak_signal_noise_ratio, structural_similarity_index_measure

    truth = small_data.x_train[:3].float() / 255
    noise = 0.05 * torch.randn(3, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    recon = (truth[[2, 0, 1]] + noise).clamp(0, 1)
    s = leakage.score(recon, truth)
    assert s["order"].tolist() == [0, 1, 2] and s["truth_index"].tolist() == [2, 0, 1]
    for i, j in enumerate([2, 0, 1]):
        pair = (recon[i:i + 1], truth[j:j + 1])
        assert float(s["psnr"][i]) == pytest.approx(float(peak_signal_noise_ratio(*pair, data_range=1.0)), abs=1e-4)
        assert float(s["ssim"][i]) == pytest.approx(
            float(structural_similarity_index_measure(*pair, data_range=1.0)), abs=1e-5)
    mirrored = leakage.score(truth.flip(3), truth, flips=True)  # augmentation flips: matched as mirrored
    assert mirrored["psnr"].min() > 60 and torch.allclose(mirrored["matched"], truth.flip(3))


@pytest.mark.parametrize("name", ["pfedes", "fedavg"])
def test_the_payload_is_the_methods_filtered_entries_and_the_attackers_loss_is_exact(name):
    method, cfg, sent, step = one_step_setup(name)
    payload, trainer = leakage.one_step_payload(cfg, sent, step)
    assert list(payload) == trainer.shared_keys == shared_keys(trainer.exchange, method_of(cfg).share)
    if name == "pfedes":
        assert all(k.startswith("proxy.") for k in payload)  # nothing of the private model leaves
        assert not any(k.split(".")[0] in ("backbone", "head", "projection") for k in payload)
    else:
        assert set(payload) == {k for k in trainer.model.state_dict()}  # the whole model
    # one_step_payload is what the project's own round does with that one batch
    same, _ = leakage.client_payload(cfg, sent, step)
    assert all(torch.allclose(payload[k], same[k], atol=1e-7) for k in payload)
    # the update of one step turns back into the gradient of the attacker's loss at the true images
    attacker = leakage.Attacker(cfg, method, sent)
    assert set(attacker.keys) <= set(payload)
    target = attacker.target(payload, sent, leakage.shared_optimizer(trainer, attacker.keys))
    free = [trainer.private["label_prior"].log_prior.clone()] if name == "pfedes" else []
    grads = attacker.gradient(to_input(step.x_train, leakage.image_of(cfg)), step.y_train, free)
    assert float(leakage.cosine_cost(grads, target)) < 1e-5
    # iDLG: one image's label read off the classifier bias's update
    single = leakage.one_step_batch(load_node_data(cfg, "embedded", 0, 3), 1, 1)
    one_payload, _ = leakage.one_step_payload(cfg, sent, single)
    assert leakage.infer_label(attacker, attacker.target(one_payload, sent, None)) == int(single.y_train[0])


def test_local_dp_clips_with_flowers_functions_and_its_noise_changes_the_update():
    _, cfg, sent, step = one_step_setup("pfedes")
    payload, _ = leakage.one_step_payload(cfg, sent, step)
    norm = leakage.update_norm(payload, sent)
    clipped = leakage.local_dp(payload, sent, norm / 2, 0.0, seed=0)
    assert leakage.update_norm(clipped, sent) == pytest.approx(norm / 2, rel=1e-5)
    noisy = leakage.local_dp(payload, sent, norm / 2, 0.1, seed=0)
    noise = torch.cat([(noisy[k] - clipped[k]).flatten().double() for k in payload])
    assert float(noise.std()) == pytest.approx(0.1 * norm / 2, rel=0.05)  # std = multiplier x clipping norm
    assert leakage.update_norm(noisy, sent) > 5 * norm  # noise / clipped update = 0.1 sqrt(33k) ~ 18
    assert list(noisy) == list(payload)


def test_the_quick_run_writes_the_table_the_csv_and_the_grid(tmp_path):
    result = leakage.main(["--quick", "--methods", "pfedes+ldp0.1", "--cases", "one_step", "--out", str(tmp_path)])
    written = json.loads((tmp_path / "leakage.json").read_text())
    assert [(r["method"], r["batch"]) for r in written["table"]] == [("pfedes+ldp0.1", "1"), ("pfedes+ldp0.1", "2")]
    assert written["table"] == result["table"] and written["not_attacked"][0]["method"] == "pfedes_paper"
    row = written["rows"][0]
    assert row["labels"].startswith("inferred (iDLG)") and row["noise_to_update"] > 1
    assert (tmp_path / "leakage.csv").read_text().startswith("method,case,batch")
    assert (tmp_path / "reconstructions.png").stat().st_size > 1000
