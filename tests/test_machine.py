"""``mrtpo.machine``: the facts a figure is stamped with."""

import os

import torch

from mrtpo.machine import machine_info


def test_machine_info_names_this_machine_and_its_versions():
    info = machine_info()
    assert info["cpus"] == os.cpu_count() and info["threads"] == torch.get_num_threads()
    assert info["torch"] == torch.__version__ and info["transformers"]
    assert len(info["load_average"]) == 3
    assert f"{info['cpus']} CPUs" in info["summary"] and torch.__version__ in info["summary"]
