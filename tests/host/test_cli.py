"""The hvgpu command line: help texts and the demo on the GPU test double."""

from click.testing import CliRunner

from hvgpu.host.cli import cli
from hvgpu.demo import run_demo
from tests.conftest import REPO

try:
    import libvirt  # noqa: F401  (the demo uses it when it is there)
    HAVE_LIBVIRT = True
except ImportError:
    HAVE_LIBVIRT = False


def test_every_command_explains_itself_with_an_example():
    runner = CliRunner()
    top = runner.invoke(cli, ["--help"])
    assert top.exit_code == 0 and "hvgpu demo" in top.output
    for command in ("agent", "gpus", "attach", "detach", "resize", "list", "status",
                    "domain-xml", "systemd-unit"):
        result = runner.invoke(cli, [command, "--help"])
        assert result.exit_code == 0 and "Example" in result.output, command
    assert runner.invoke(cli, ["demo", "--help"]).exit_code == 0


def test_agent_with_nowhere_to_listen_says_so(tmp_path):
    result = CliRunner().invoke(cli, ["agent", "--no-vsock", "--state-dir", str(tmp_path),
                                      "--listen", "unix://relative"])
    assert result.exit_code == 1
    assert "absolute" in result.output


def test_commands_without_an_agent_say_so(tmp_path):
    result = CliRunner().invoke(cli, ["--control", str(tmp_path / "none.sock"), "list"])
    assert result.exit_code == 1
    assert "is `hvgpu agent` running" in result.output


def test_demo_attaches_runs_checked_cuda_and_detaches():
    from tests.conftest import fake_gpus

    lines = []
    rc = run_demo(4096, echo=lines.append, device="tests.fake_gpu:FakeDevice",
                  env={"PYTHONPATH": str(REPO)}, gpus=fake_gpus)
    text = "\n".join(lines)
    assert rc == 0, text
    if HAVE_LIBVIRT:
        assert "test:///default" in text and "vsock CID 3" in text
        assert "urn:x-hvgpu:slice:1" in text and "metadata removed" in text
    else:
        assert "libvirt:   not available" in text and "slice released" in text
    assert "saxpy:     n=4096" in text and "OK" in text and "matmul:    256x256" in text


def test_demo_without_a_gpu_says_plainly_what_did_not_run(monkeypatch):
    from hvgpu.host import inventory
    from tests.fake_nvml import FakeNvml

    monkeypatch.setattr(inventory, "_load_nvml", lambda: FakeNvml(fail_init="Driver Not Loaded"))
    lines = []
    rc = run_demo(4096, echo=lines.append, device="tests.fake_gpu:NoDriver",
                  env={"PYTHONPATH": str(REPO)})
    text = "\n".join(lines)
    assert rc == 0, text
    assert "none usable here (no NVIDIA driver/NVML found: Driver Not Loaded)" in text
    assert "cuda:      NOT run" in text and "CUDA did NOT run" in text
    assert ("metadata removed" if HAVE_LIBVIRT else "slice released") in text


def test_domain_xml_prints_what_the_golden_file_holds():
    from tests.host.test_render import GOLDEN

    out = CliRunner().invoke(cli, ["domain-xml", "vm1", "--memory", "8G", "--vcpus", "4",
                                   "--disk", "/var/lib/libvirt/images/vm1.qcow2",
                                   "--cloud-init", "/var/lib/libvirt/images/vm1-seed.iso"])
    assert out.exit_code == 0
    assert out.output == (GOLDEN / "domain-vm1.xml").read_text()


def test_domain_xml_with_a_vhost_user_vsock_backend():
    from tests.host.test_render import GOLDEN

    out = CliRunner().invoke(cli, ["domain-xml", "vm3", "--memory", "4G", "--vcpus", "2",
                                   "--disk", "/var/lib/libvirt/images/vm3.qcow2",
                                   "--vhost-user-vsock", "/run/hvgpu/vm3-vhost.sock"])
    assert out.exit_code == 0, out.output
    assert out.output == (GOLDEN / "domain-vm3-vhost-user-vsock.xml").read_text()
    out = CliRunner().invoke(cli, ["domain-xml", "vm3", "--disk", "/x",
                                   "--vhost-user-vsock", "vm3-vhost.sock"])
    assert out.exit_code == 2 and "not an absolute path" in out.output


def test_domain_xml_with_a_shared_memory_device():
    from tests.host.test_render import GOLDEN

    out = CliRunner().invoke(cli, ["domain-xml", "vm4", "--memory", "8G", "--vcpus", "4",
                                   "--disk", "/var/lib/libvirt/images/vm4.qcow2", "--shm", "1G"])
    assert out.exit_code == 0, out.output
    assert out.output == (GOLDEN / "domain-vm4-shm.xml").read_text()
    out = CliRunner().invoke(cli, ["domain-xml", "vm4", "--disk", "/x", "--shm", "3G"])
    assert out.exit_code == 1
    assert "'3G' (3 GiB) is not a size for a shared-memory region" in out.output
    assert "a power of two from 1 MiB to 1 TiB (1M, 2M, 4M, ... 512M, 1G, 2G, ...)" in out.output


def test_shm_says_what_the_region_is_for():
    for command in ("attach", "resize", "domain-xml"):
        out = CliRunner().invoke(cli, [command, "--help"])
        assert "--shm SIZE" in out.output, command
    text = " ".join(CliRunner().invoke(cli, ["attach", "--help"]).output.split())
    assert "pinned host memory (cudaMallocHost) and their copy staging" in text
    assert "copies through it are DMA" in text and "power of two" in text
    text = " ".join(CliRunner().invoke(cli, ["resize", "--help"]).output.split())
    assert "cannot be resized live" in text


def test_agent_local_shm_takes_a_size_or_zero():
    result = CliRunner().invoke(cli, ["agent", "--no-vsock", "--local-shm", "3X"])
    assert result.exit_code == 2 and "--local-shm" in result.output, result.output
    assert "memfds" in CliRunner().invoke(cli, ["agent", "--help"]).output
