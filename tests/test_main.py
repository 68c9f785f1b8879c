"""`python -m vit_rope`: the tour runs through every image family the registry holds and prints what it claims."""

import re

from vit_rope import FAMILIES
from vit_rope.__main__ import main


def test_the_tour_runs_and_commuting_families_score_alike_at_every_place(capsys):
    main()
    out = capsys.readouterr().out
    for name, family in FAMILIES.items():
        if not (family.rotary and family.min_axes <= 2):
            continue
        scores = re.search(rf"^  {name}\s+(\S+)\s+(\S+)\s+(\S+)", out, re.M).groups()
        assert (len(set(scores)) == 1) == family.commutes, (name, scores)  # relative exactly where it commutes
    assert all(mode in out for mode in ("none", "pi", "ntk", "yarn", "normalized"))
