"""The models a run builds (vit_rope/training/models.py): any timm model, given only the run's defaults it takes."""

import json

import train


def test_any_timm_model_trains_without_kwargs_it_never_asked_for(tmp_path):
    """Issue 35, 8: ``--models resnet18`` was handed ``img_size`` (a ViT's kwarg) and refused to build; the run's
    defaults (image size, frames, drop path) go only to models that take them, a kwarg the user gives still must fit."""
    (tmp_path / "c.yaml").write_text("model_kwargs: {}\n")
    args = ["--config", str(tmp_path / "c.yaml"), "--models", "resnet18", "--img-size", "16", "--eval-sizes", "16",
            "--train-samples", "16", "--val-samples", "8", "--epochs", "1", "--batch-size", "8", "--drop-path", "0.1",
            "--no-native-eval", "--output", str(tmp_path / "out")]  # fmt: skip
    rows = train.main(args)
    assert [(r["model"], r["rope_scaling"]) for r in rows] == [("resnet18", "-")]
    saved = json.loads((tmp_path / "out" / "resnet18" / "results.json").read_text())
    assert saved == rows


def test_pretrained_weights_of_another_class_count_leave_a_new_head():
    """timm's --pretrained loader keeps a classifier of another class count at its random initialisation: the model
    says so (``new_head``), and --eval-only refuses to evaluate it (train.check_head)."""
    import timm

    from vit_rope.training import models

    model = timm.create_model("vit_ape_tiny", img_size=16, patch_size=8, depth=1, embed_dim=32, num_heads=2)
    model.pretrained_cfg = {**model.pretrained_cfg, "num_classes": 1000, "classifier": "head"}
    assert models.new_head(model, pretrained=True, num_classes=2) == ["head"]
    assert models.new_head(model, pretrained=True, num_classes=1000) == []
    assert models.new_head(model, pretrained=False, num_classes=2) == []
