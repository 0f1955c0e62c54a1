"""The hvgpu command line: help texts and the demo on the GPU test double."""

from click.testing import CliRunner

from hvgpu.host.cli import cli
from hvgpu.host.demo import run_demo
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


def test_domain_xml_with_a_region_device():
    from tests.host.test_render import GOLDEN

    out = CliRunner().invoke(cli, ["domain-xml", "vm4", "--memory", "8G", "--vcpus", "4",
                                   "--disk", "/var/lib/libvirt/images/vm4.qcow2", "--region", "1G"])
    assert out.exit_code == 0, out.output
    assert out.output == (GOLDEN / "domain-vm4-region.xml").read_text()
    out = CliRunner().invoke(cli, ["domain-xml", "vm4", "--disk", "/x", "--region", "3G"])
    assert out.exit_code == 1
    assert "'3G' (3 GiB) is not a size for a region" in out.output
    assert "a power of two from 1 MiB to 1 TiB (1M, 2M, 4M, ... 512M, 1G, 2G, ...)" in out.output


def test_region_says_what_it_is_for():
    for command in ("attach", "resize", "domain-xml"):
        out = CliRunner().invoke(cli, [command, "--help"])
        assert "--region SIZE" in out.output, command
    text = " ".join(CliRunner().invoke(cli, ["attach", "--help"]).output.split())
    assert "pinned host memory (cudaMallocHost) and their copy staging" in text
    assert "copies through it are DMA" in text and "power of two" in text
    text = " ".join(CliRunner().invoke(cli, ["resize", "--help"]).output.split())
    assert "cannot be resized live" in text


def test_agent_local_region_takes_a_size_or_zero():
    result = CliRunner().invoke(cli, ["agent", "--no-vsock", "--local-region", "3X"])
    assert result.exit_code == 2 and "--local-region" in result.output, result.output
    assert "memfds" in CliRunner().invoke(cli, ["agent", "--help"]).output


# -- what a new user types -------------------------------------------------------------

import pytest  # noqa: E402

from tests.conftest import FAKE_DEVICE, RunningAgent  # noqa: E402


@pytest.mark.parametrize("args, said", [
    (["--mem", "4"], "'4' has no unit"),  # it was a 4-byte slice
    (["--mem", "4096"], "'4096' has no unit"),
    (["--mem", "4G", "--compute", "1"], "'1' is not a share"),  # it meant 100%
    (["--mem", "4G", "--compute", "2"], "'2' is not a share"),  # and this 2%
    (["--mem", "4G", "--cid", "-3"], "-3 is not a guest's CID"),
    (["--mem", "4G", "--cid", "2"], "2 is not a guest's CID"),  # the host
    (["--mem", "4G", "--cid", "4294967296"], "4294967296 is not a guest's CID"),
    (["--mem", "4G", "--region", "4"], "'4' has no unit"),
])
def test_attach_refuses_unitless_sizes_bare_shares_and_cids_no_guest_has(tmp_path, args, said):
    result = CliRunner().invoke(cli, ["--control", str(tmp_path / "none.sock"), "attach", "vm1",
                                      *args])
    assert result.exit_code == 2, result.output
    assert said in result.output
    assert "is `hvgpu agent` running" not in result.output  # refused before asking it
    if "unit" in said:
        assert "512M, 4G, 4GiB or 1.5G" in result.output and "powers of 1024" in result.output
    if "share" in said:
        assert "25%" in result.output and "fraction below 1" in result.output
    if "CID" in said:
        assert "3 to 4294967294" in result.output


@pytest.mark.parametrize("args", [["--mem", "4"], ["--compute", "1"], ["--region", "4"]])
def test_resize_refuses_them_too(tmp_path, args):
    result = CliRunner().invoke(cli, ["--control", str(tmp_path / "none.sock"), "resize", "vm1",
                                      *args])
    assert result.exit_code == 2 and "Invalid value" in result.output


def test_help_says_which_forms_sizes_shares_and_cids_take():
    runner = CliRunner()
    attach = runner.invoke(cli, ["attach", "--help"]).output
    for words in ("512M, 4G, 4GiB or 1.5G", "powers of 1024", "25%", "fraction below 1",
                  "--allow-time-shared", "3 to 4294967294", "UUID"):
        assert words in " ".join(attach.split()), words
    resize = " ".join(runner.invoke(cli, ["resize", "--help"]).output.split())
    assert "--allow-time-shared" in resize and "UUID" in resize
    assert "UUID" in " ".join(runner.invoke(cli, ["detach", "--help"]).output.split())


@pytest.mark.parametrize("args, said", [
    (["--vcpus", "-4"], "a domain has 1 to 255 virtual CPUs"),
    (["--vcpus", "0"], "a domain has 1 to 255 virtual CPUs"),
    (["--vcpus", "256"], "a domain has 1 to 255 virtual CPUs"),
    (["--memory", "4"], "'4' has no unit"),  # it printed 0 KiB
    (["--memory", "4K"], "at least 1M"),
])
def test_domain_xml_refuses_what_libvirt_would(args, said):
    result = CliRunner().invoke(cli, ["domain-xml", "vm1", "--disk", "/d.qcow2", *args])
    assert result.exit_code == 2 and said in result.output, result.output
    assert "<domain" not in result.output


def test_domain_xml_takes_the_smallest_ram():
    result = CliRunner().invoke(cli, ["domain-xml", "vm1", "--disk", "/d.qcow2", "--memory", "1M"])
    assert result.exit_code == 0 and "<memory unit='KiB'>1024</memory>" in result.output


def test_listen_port_past_65535_is_refused(tmp_path):
    # tcp://127.0.0.1:99999 listened on port 34463 (99999 mod 65536)
    result = CliRunner().invoke(cli, ["agent", "--no-vsock", "--state-dir", str(tmp_path),
                                      "--listen", "tcp://127.0.0.1:99999"])
    assert result.exit_code == 1 and "a tcp port is 1 to 65535" in result.output
    result = CliRunner().invoke(cli, ["agent", "--vsock-port", "4294967295", "--state-dir",
                                      str(tmp_path)])
    assert result.exit_code == 2 and "--vsock-port" in result.output


def test_connect_is_refused_where_no_libvirt_of_yours_is_used():
    result = CliRunner().invoke(cli, ["-c", "qemu:///system", "domain-xml", "vm1", "--disk",
                                      "/d.qcow2"])
    assert result.exit_code == 1 and "-c/--connect does not apply to `domain-xml`" in result.output
    result = CliRunner().invoke(cli, ["-c", "qemu:///system", "demo"])
    assert result.exit_code == 1 and "-c/--connect does not apply to `demo`" in result.output


@pytest.fixture
def agent(tmp_path):
    running = RunningAgent(tmp_path, FAKE_DEVICE, slices=True, vms=("vm1",))  # no MPS here
    yield running
    running.stop()


def test_connect_is_refused_by_an_agent_that_manages_another_libvirt(agent):
    runner = CliRunner()
    base = ["--control", agent.control]
    assert runner.invoke(cli, base + ["attach", "vm1", "--mem", "64M"]).exit_code == 0
    for command in (["list"], ["status"], ["gpus"], ["detach", "vm1"],
                    ["resize", "vm1", "--mem", "32M"], ["attach", "vm2", "--mem", "8M"]):
        result = runner.invoke(cli, ["-c", "test:///default"] + base + command)
        assert result.exit_code == 1, command
        assert "this agent manages VMs through no libvirt" in result.output, command
        assert "not test:///default" in result.output
    assert [s["vm"] for s in agent.api.list()] == ["vm1"]  # nothing changed
    assert runner.invoke(cli, base + ["list"]).exit_code == 0  # without -c: this agent's


def test_a_compute_share_without_mps_is_refused_unless_allowed_then_said_loudly(agent, caplog):
    runner = CliRunner()
    base = ["--control", agent.control]
    result = runner.invoke(cli, base + ["attach", "vm1", "--mem", "64M", "--compute", "25%"])
    assert result.exit_code == 1
    assert "cannot be enforced" in result.output and "--allow-time-shared" in result.output
    assert agent.api.list() == []  # nothing was attached
    with caplog.at_level("WARNING", logger="hvgpu.host.control_api"):
        result = runner.invoke(cli, base + ["attach", "vm1", "--mem", "64M", "--compute", "25%",
                                            "--allow-time-shared"])
    assert result.exit_code == 0, result.output
    assert "hvgpu: WARNING: vm1: compute share 25% is NOT enforced" in result.output
    assert any("compute share 25% is NOT enforced" in r.getMessage() for r in caplog.records)
    result = runner.invoke(cli, base + ["resize", "vm1", "--compute", "50%"])
    assert result.exit_code == 1 and "cannot be enforced" in result.output
    assert agent.api.list()[0]["compute"] == 25
    result = runner.invoke(cli, base + ["resize", "vm1", "--compute", "0.5",
                                        "--allow-time-shared"])
    assert result.exit_code == 0 and "WARNING" in result.output
    assert agent.api.list()[0]["compute"] == 50
    # without a share there is nothing to enforce, and nothing to say
    result = runner.invoke(cli, base + ["resize", "vm1", "--mem", "32M"])
    assert result.exit_code == 0 and "WARNING" not in result.output


def test_a_uuid_without_libvirt_that_names_no_slice_is_said_plainly(agent):
    uuid = "5a0e33c4-7d2b-4f7e-9c1a-2b3c4d5e6f70"
    for command in (["detach", uuid], ["resize", uuid, "--mem", "8M"]):
        result = CliRunner().invoke(cli, ["--control", agent.control] + command)
        assert result.exit_code == 1
        assert f"'{uuid}' looks like a domain UUID, but libvirt is not available" in result.output


def test_a_cid_another_slice_has_is_refused(agent):
    runner = CliRunner()
    base = ["--control", agent.control]
    assert runner.invoke(cli, base + ["attach", "fc1", "--mem", "8M", "--cid", "40"]).exit_code == 0
    result = runner.invoke(cli, base + ["attach", "fc2", "--mem", "8M", "--cid", "40"])
    assert result.exit_code == 1 and "CID 40 already belongs to 'fc1'" in result.output
    out = runner.invoke(cli, base + ["list"]).output
    assert "fc1" in out and "40" in out


@pytest.mark.skipif(not HAVE_LIBVIRT, reason="libvirt-python is not installed")
def test_demo_with_a_vm_and_libvirt_unreachable_fails_and_says_what_it_skipped():
    from tests.conftest import fake_gpus

    lines = []
    rc = run_demo(4096, echo=lines.append, device="tests.fake_gpu:FakeDevice",
                  env={"PYTHONPATH": str(REPO)}, gpus=fake_gpus, vm="nosuch",
                  connect="qemu+tcp://127.0.0.1:1/system")  # nothing listens on port 1
    text = "\n".join(lines)
    assert rc == 1, text
    assert "NOT reachable at qemu+tcp://127.0.0.1:1/system" in text
    assert "metadata:  SKIPPED" in text and "metadata removed" not in text
    assert "libvirt metadata and the control API ran" not in text
    assert "FAILED: libvirt at qemu+tcp://127.0.0.1:1/system is not reachable" in text


@pytest.mark.skipif(not HAVE_LIBVIRT, reason="libvirt-python is not installed")
def test_demo_with_a_vm_libvirt_lacks_is_an_error_before_anything_is_attached():
    result = CliRunner().invoke(cli, ["-c", "test:///default", "demo", "--vm", "nosuch"])
    assert result.exit_code == 1
    assert "libvirt has no domain 'nosuch'" in result.output
    assert "attach:" not in result.output


@pytest.fixture
def installed_in_opt(monkeypatch):
    """hvgpu as the unit expects it, outside what the unit hides (this checkout may be
    under /tmp or /home, its Python under /root)."""
    from hvgpu.host import cli as cli_module

    monkeypatch.setattr(cli_module, "_unit_program_paths",
                        lambda exe: [("the hvgpu command", "/opt/hvgpu/bin/hvgpu")])


def test_systemd_unit_writes_what_differs_from_the_unit_s_own_directories(installed_in_opt):
    plain = CliRunner().invoke(cli, ["systemd-unit"])
    assert plain.exit_code == 0 and " agent\n" in plain.output  # options: agent.toml's
    assert "\nReadWritePaths=" not in plain.output
    result = CliRunner().invoke(cli, ["-c", "qemu:///session", "systemd-unit", "--state-dir",
                                      "/srv/hvgpu/", "--cache-dir", "/var/cache/hvgpu",
                                      "--config", "/srv/agent.toml"])
    assert result.exit_code == 0, result.output
    assert (" --connect qemu:///session agent --config /srv/agent.toml --state-dir /srv/hvgpu\n"
            in result.output)
    assert "ReadWritePaths=/srv/hvgpu\n" in result.output
    assert "ReadWritePaths=/var/cache/hvgpu" not in result.output  # CacheDirectory's own
    bad = CliRunner().invoke(cli, ["systemd-unit", "--state-dir", "srv"])
    assert bad.exit_code == 2 and "an absolute path" in bad.output


# -- --connect and --control after the command, as the README writes them -------------


def test_agent_takes_connect_after_the_command_too(tmp_path, monkeypatch):
    from hvgpu.errors import HvgpuError
    from hvgpu.host import agent as agent_module

    seen = {}

    class Stop(HvgpuError):
        pass

    def start(config, gpus=None):
        seen["connect"] = config.connect
        raise Stop("stopped before starting")
    monkeypatch.setattr(agent_module, "Agent", start)
    args = ["--no-vsock", "--state-dir", str(tmp_path), "--config", str(tmp_path / "a.toml")]
    (tmp_path / "a.toml").write_text('connect = "qemu:///session"\n')
    for given, means in ((["agent", "--connect", "test:///default"], "test:///default"),
                         (["agent", "-c", "test:///default"], "test:///default"),
                         (["--connect", "test:///default", "agent"], "test:///default"),
                         (["agent"], "qemu:///session")):  # the file's, when none is given
        seen.clear()
        result = CliRunner().invoke(cli, given + args)
        assert result.exit_code == 1 and "stopped before starting" in result.output, result.output
        assert seen["connect"] == means, given
    result = CliRunner().invoke(cli, ["-c", "qemu:///system", "agent", "-c", "test:///default"])
    assert result.exit_code == 2 and "give it once" in result.output


def test_commands_that_talk_to_the_agent_take_connect_and_control_after_them(agent):
    runner = CliRunner()
    assert runner.invoke(cli, ["attach", "vm1", "--mem", "64M", "--control",
                               agent.control]).exit_code == 0
    for command in (["list"], ["status"], ["gpus"], ["detach", "vm1"],
                    ["resize", "vm1", "--mem", "32M"], ["attach", "vm2", "--mem", "8M"]):
        result = runner.invoke(cli, command + ["--control", agent.control,
                                               "--connect", "test:///default"])
        assert result.exit_code == 1, command
        assert "this agent manages VMs through no libvirt" in result.output, command
    assert [s["vm"] for s in agent.api.list()] == ["vm1"]
    assert "vm1" in runner.invoke(cli, ["list", "--control", agent.control]).output


def test_systemd_unit_and_demo_take_connect_after_them(installed_in_opt):
    result = CliRunner().invoke(cli, ["systemd-unit", "--connect", "qemu:///session"])
    assert result.exit_code == 0 and " --connect qemu:///session agent\n" in result.output
    result = CliRunner().invoke(cli, ["demo", "-c", "qemu:///system"])
    assert result.exit_code == 1 and "-c/--connect does not apply to `demo`" in result.output


# -- one rule for VM names -------------------------------------------------------------


@pytest.mark.parametrize("name, said", [
    ("v/m", "it contains '/'"),
    ("vm#1", "it contains '#'"),
    ("vm\x07", "the control character U+0007"),
    ("v" * 300, "is 300 bytes long; a VM name has at most 255"),
])
def test_domain_xml_refuses_the_names_attach_refuses(tmp_path, name, said):
    runner = CliRunner()
    made = runner.invoke(cli, ["domain-xml", name, "--disk", "/d.qcow2"])
    assert made.exit_code == 2 and said in made.output, made.output
    assert "<domain" not in made.output
    for command in (["attach", name, "--mem", "4G"], ["detach", name],
                    ["resize", name, "--mem", "4G"]):
        refused = runner.invoke(cli, ["--control", str(tmp_path / "none.sock"), *command])
        assert refused.exit_code == 2 and said in refused.output, command
        assert "no agent answers" not in refused.output  # refused before asking


def test_the_agent_refuses_them_by_the_same_rule(agent):
    from hvgpu.host.names import BadVmName

    for name in ("v/m", "vm\x07", "v" * 300):
        with pytest.raises(BadVmName):
            agent.api.attach(name, "8M")


# -- a unit that could not start --------------------------------------------------------


def test_systemd_unit_from_a_checkout_under_tmp_is_refused(monkeypatch):
    import shutil

    monkeypatch.setattr(shutil, "which", lambda name: "/tmp/hvgpu-checkout/.venv/bin/hvgpu")
    result = CliRunner().invoke(cli, ["systemd-unit"])
    assert result.exit_code == 1
    assert "ExecStart" not in result.output
    text = " ".join(result.output.split())
    assert ("the unit would not start: the hvgpu command is /tmp/hvgpu-checkout/.venv/bin/hvgpu, "
            "and the unit's PrivateTmp=yes gives the service a /tmp of its own, empty") in text
    assert "python3 -m venv /opt/hvgpu" in text
    assert CliRunner().invoke(cli, ["systemd-unit", "--guest"]).exit_code == 0  # not the agent's


def test_what_the_unit_hides_is_what_it_says():
    from hvgpu.host.cli import _hidden_from_unit

    unit = (REPO / "templates" / "systemd" / "hvgpu-agent.service.j2").read_text()
    assert "PrivateTmp=yes" in unit and "ProtectHome=yes" in unit
    for path, said in (("/home/alice/hvgpu/hvgpu", "ProtectHome=yes makes /home unreachable"),
                       ("/root/.pyenv/versions/3.12/bin/python3.12", "ProtectHome=yes"),
                       ("/run/user/1000/hvgpu", "ProtectHome=yes"),
                       ("/var/tmp/venv/bin/python", "PrivateTmp=yes")):
        assert said in _hidden_from_unit([("its Python", path)]), path
    for path in ("/opt/hvgpu/bin/hvgpu", "/usr/bin/python3.12", "/tmpfs/hvgpu", "/homes/x"):
        assert _hidden_from_unit([("its Python", path)]) is None, path


def test_a_console_script_s_python_is_its_shebang_s(tmp_path):
    from hvgpu.host.cli import _interpreter, _unit_program_paths

    script = tmp_path / "hvgpu"
    script.write_text("#!/srv/venv/bin/python3 -E\nimport sys\n")
    assert _interpreter(str(script)) == "/srv/venv/bin/python3"
    assert ("its Python", "/srv/venv/bin/python3") in _unit_program_paths(str(script))


# -- sizes no slice can have ----------------------------------------------------------------


@pytest.mark.parametrize("args, said", [
    (["--mem", "10B"], "a slice's memory quota is at least 1 MiB"),
    (["--mem", "99999999999999999999999G"], "is more than 1024 TiB"),
])
def test_attach_and_resize_refuse_sizes_no_slice_can_have(tmp_path, args, said):
    for command in (["attach", "vm1"], ["resize", "vm1"]):
        result = CliRunner().invoke(cli, ["--control", str(tmp_path / "none.sock"), *command,
                                          *args])
        assert result.exit_code == 2 and said in result.output, result.output
        assert "99999999999999991611392" not in result.output


def test_a_quota_larger_than_any_gpu_is_refused_naming_the_largest(agent):
    runner = CliRunner()
    base = ["--control", agent.control]
    result = runner.invoke(cli, base + ["attach", "vm1", "--mem", "2G"])
    assert result.exit_code == 1
    assert ("--mem 2 GiB is more than any GPU could give: the largest here, GPU 0 "
            "(hvgpu fake GPU), has 1 GiB in all") in result.output
    assert runner.invoke(cli, base + ["attach", "vm1", "--mem", "64M"]).exit_code == 0
    result = runner.invoke(cli, base + ["resize", "vm1", "--mem", "1.5T"])
    assert result.exit_code == 1
    assert ("--mem 1.5 TiB is more than any GPU could give: the slice's, GPU 0 (hvgpu fake "
            "GPU), has 1 GiB in all") in result.output
    assert agent.api.list()[0]["mem"] == 64 << 20


def test_a_region_larger_than_the_host_is_refused(agent, monkeypatch):
    from hvgpu.host import control_api

    monkeypatch.setattr(control_api, "host_memory", lambda: 23 << 30)
    runner = CliRunner()
    base = ["--control", agent.control]
    result = runner.invoke(cli, base + ["attach", "vm1", "--mem", "64M", "--region", "1T"])
    assert result.exit_code == 1
    assert ("--region 1 TiB is more than this host's memory (23 GiB): a region is "
            "host RAM") in result.output
    assert agent.api.list() == []
    assert runner.invoke(cli, base + ["attach", "vm1", "--mem", "64M", "--region", "16G"]
                         ).exit_code == 0
    result = runner.invoke(cli, base + ["resize", "vm1", "--region", "32G"])
    assert result.exit_code == 1 and "more than this host's memory (23 GiB)" in result.output


def test_shm_the_earlier_name_of_region_still_works_and_is_not_shown(agent):
    from tests.host.test_render import GOLDEN

    runner = CliRunner()
    base = ["--control", agent.control]
    out = runner.invoke(cli, base + ["attach", "vm1", "--mem", "64M", "--shm", "16M"])
    assert out.exit_code == 0, out.output
    assert agent.api.list()[0]["region"] == 16 << 20
    assert runner.invoke(cli, base + ["resize", "vm1", "--shm", "32M"]).exit_code == 0
    assert agent.api.list()[0]["region"] == 32 << 20
    out = runner.invoke(cli, base + ["resize", "vm1", "--shm", "3M"])
    assert out.exit_code == 2 and "not a size for a region" in out.output  # checked alike
    out = runner.invoke(cli, base + ["resize", "vm1", "--shm", "1M", "--region", "2M"])
    assert out.exit_code == 2 and "disagree" in out.output
    assert agent.api.list()[0]["region"] == 32 << 20
    out = runner.invoke(cli, ["domain-xml", "vm4", "--memory", "8G", "--vcpus", "4", "--disk",
                              "/var/lib/libvirt/images/vm4.qcow2", "--shm", "1G"])
    assert out.output == (GOLDEN / "domain-vm4-region.xml").read_text()
    for command in ("attach", "resize", "domain-xml"):
        assert "--shm" not in runner.invoke(cli, [command, "--help"]).output, command
    assert "--local-shm" not in runner.invoke(cli, ["agent", "--help"]).output


def test_the_control_api_takes_shm_from_an_earlier_versions_client(agent):
    from hvgpu.units import BadValue

    # an earlier CLI sends the region's size as shm: the same call, the same slice
    assert agent.api.attach("vm1", "64M", shm="16M")["region"] == 16 << 20
    assert agent.api.resize("vm1", shm="32M")["region"] == 32 << 20
    with pytest.raises(BadValue, match="disagree"):
        agent.api.resize("vm1", region="1M", shm="2M")


# -- one word for each thing ------------------------------------------------------------


def test_a_slice_without_a_share_is_time_shared_in_every_listing(agent):
    runner = CliRunner()
    base = ["--control", agent.control]
    attached = runner.invoke(cli, base + ["attach", "vm1", "--mem", "512M"])
    assert "512 MiB, compute time-shared" in attached.output
    for command in ("list", "status"):
        out = runner.invoke(cli, base + [command]).output
        assert "time-shared" in out and " shared " not in out, command


def test_a_share_mps_does_not_enforce_says_so_wherever_it_is_shown(agent):
    runner = CliRunner()
    base = ["--control", agent.control]
    attached = runner.invoke(cli, base + ["attach", "vm1", "--mem", "64M", "--compute", "25%",
                                          "--allow-time-shared"])
    assert "compute 25% (not enforced)" in attached.output
    assert agent.api.list()[0]["compute_enforced"] is False
    for command in ("list", "status"):
        assert "25% (not enforced)" in runner.invoke(cli, base + [command]).output, command
    resized = runner.invoke(cli, base + ["resize", "vm1", "--compute", "50%",
                                         "--allow-time-shared"])
    assert "compute 50% (not enforced)" in resized.output


def _gpus_with_mps():
    from hvgpu.host.inventory import Gpu

    return [Gpu(0, "GPU-00010203-0405-0607-0809-0a0b0c0d0e0f", "hvgpu fake GPU", 1 << 30, 0,
                None, False, True, "")]


def test_a_share_mps_enforces_is_shown_plainly(tmp_path):
    running = RunningAgent(tmp_path, FAKE_DEVICE, slices=True, vms=("vm1",),
                           gpus=_gpus_with_mps)
    try:
        running.agent.mps.running = True  # what a started MPS daemon says (none runs here)
        base = ["--control", running.control]
        attached = CliRunner().invoke(cli, base + ["attach", "vm1", "--mem", "64M",
                                                   "--compute", "25%"])
        assert attached.exit_code == 0, attached.output
        assert "compute 25%," in attached.output and "not enforced" not in attached.output
        assert running.api.list()[0]["compute_enforced"] is True
        assert "not enforced" not in CliRunner().invoke(cli, base + ["list"]).output
        # and where NVML has no utilisation for the GPU, nvidia-smi's N/A, not a 0%
        gpus = CliRunner().invoke(cli, base + ["gpus"]).output
        assert "25%               N/A   GPU-" in gpus.splitlines()[1], gpus
    finally:
        running.agent.mps.running = False
        running.stop()


def test_status_shows_the_slice_s_own_utilisation_or_n_a_as_smi_does(agent):
    import re

    from hvgpu.host.names import VgpuKey

    runner = CliRunner()
    base = ["--control", agent.control]
    runner.invoke(cli, base + ["attach", "vm1", "--mem", "64M"])
    out = runner.invoke(cli, base + ["status"]).output.splitlines()
    assert re.search(r"CONNECTIONS +UTIL +GPU UTIL +EXECUTORS", out[0]), out[0]
    # NVML has no figure for the slice (hvgpu-guest smi: N/A); the whole GPU's is 0%
    assert re.search(r" N/A +0% ", out[1]) and agent.api.status()[0]["utilization"] is None
    agent.agent.registry.get(VgpuKey("vm1")).util = 37  # as the sampler sets it
    out = runner.invoke(cli, base + ["status"]).output.splitlines()
    assert re.search(r" 37% +0% ", out[1]), out[1]


def test_a_host_command_in_the_guest_install_says_what_to_install(tmp_path):
    # A plain `pip install hvgpu` (the guest's) has click, so `hvgpu` starts; the control
    # lane's gRPC is the host extra's
    import subprocess
    import sys

    program = ("import sys; sys.modules['grpc'] = None\n"  # as if it were not installed
               "from hvgpu.host.cli import main\n"
               f"sys.argv = ['hvgpu', '--control', {str(tmp_path / 'c.sock')!r}, 'list']\n"
               "main()\n")
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                          cwd=REPO, timeout=120)
    assert done.returncode == 1, done.stderr
    assert "pip install 'hvgpu[host]'" in done.stderr and "grpc" in done.stderr
    assert "Traceback" not in done.stderr
