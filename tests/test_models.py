"""The models a run builds (vit_rope/training/models.py): any timm model, given only the run's defaults it takes."""

import train
from tests.test_folder import EPOCH


def test_any_timm_model_trains_without_kwargs_it_never_asked_for(tmp_path):
    """Issue 35, 8: ``--models resnet18`` was handed ``img_size`` (a ViT's kwarg) and refused to build; the run's
    defaults (image size, frames, drop path) go only to models that take them, a kwarg the user gives still must fit."""
    args = [*EPOCH, "--models", "resnet18", "--model-kwargs", "--drop-path", "0.1", "--output", str(tmp_path / "out")]
    rows = train.main(args)
    assert [(r["model"], r["rope_scaling"]) for r in rows] == [("resnet18", "-")]
    record = train.json.loads((tmp_path / "out" / "resnet18" / "results.json").read_text())
    assert record == rows
