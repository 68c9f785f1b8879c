"""train.py's harness: its settings, data, the models a run builds and the weights it loads, the run folder and its
plan, processes and random state, results. The model library (``vit_rope`` outside this package) never imports it;
``pip install vit-rope[train]`` brings what it needs."""
