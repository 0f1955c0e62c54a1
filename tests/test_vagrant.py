"""vagrant/Vagrantfile is valid for Vagrant with the vagrant-libvirt provider."""

import shutil
import subprocess
from pathlib import Path

import pytest

VAGRANT = shutil.which("vagrant")


@pytest.mark.skipif(VAGRANT is None, reason="vagrant is not installed")
def test_vagrantfile_validates():
    out = subprocess.run([VAGRANT, "validate"], cwd=Path(__file__).parents[1] / "vagrant",
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "validated successfully" in out.stdout
