"""Hostile or broken campaign files: each is refused in one line (FILE:LINE: key: message), fast,
with bounded memory; none reaches a traceback."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from runner.errors import SpecError
from runner.experiments.launch import flag_name
from runner.overrides import parse_overrides
from runner.plan import expand
from runner.spec import load_campaign

GOOD = """\
name: demo
inventory: inventory
experiments:
  - kind: selftest
    modes: [noop]
"""


def error_of(path: Path) -> str:
    with pytest.raises(SpecError) as info:
        load_campaign(path)
    assert len(info.value.lines) >= 1
    return info.value.lines[0]


def test_alias_bomb_is_refused_quickly(write_campaign: Callable[[str], Path]) -> None:
    # 9 levels of 9 aliases: ~387 million values when expanded (this took 30-55 s and GBs, then MemoryError).
    lines = ['a0: &a0 ["x", "x", "x", "x", "x", "x", "x", "x", "x"]']
    for i in range(1, 10):
        refs = ", ".join([f"*a{i - 1}"] * 9)
        lines.append(f"a{i}: &a{i} [{refs}]")
    path = write_campaign(GOOD.replace("name: demo\n", "name: demo\ndescription:\n  " + "\n  ".join(lines) + "\n"))
    started = time.monotonic()
    line = error_of(path)
    assert time.monotonic() - started < 2
    assert "expands to more than 100000 values" in line and line.startswith(f"{path}:")


def test_a_few_aliases_still_work(write_campaign: Callable[[str], Path]) -> None:
    text = GOOD.replace("experiments:\n", "x-args: &args {max-model-len: 4096}\nexperiments:\n")
    path = write_campaign(text.replace("x-args", "description").replace("{max-model-len: 4096}", "'ok'"))
    assert load_campaign(path).campaign.description == "ok"


@pytest.mark.parametrize("depth", [40, 5000])
def test_deep_nesting_is_one_line(write_campaign: Callable[[str], Path], depth: int) -> None:
    path = write_campaign(GOOD + "defaults: " + "[" * depth + "]" * depth + "\n")
    assert "nests deeper than 32 levels" in error_of(path)


@pytest.mark.parametrize(("content", "expected"), [
    (GOOD.encode("utf-16"), "is UTF-16 text"),
    (b"name: d\xe9mo\n", "is not UTF-8 text (byte 0xe9)"),
    (b"\x7fELF\x02\x01\x01\x00\x00\x00", "holds a NUL byte"),
])
def test_text_that_is_not_utf8_is_one_line(tmp_path: Path, content: bytes, expected: str) -> None:
    path = tmp_path / "c.yaml"
    path.write_bytes(content)
    assert expected in error_of(path)


def test_fifo_and_devices_are_never_read(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    assert error_of(fifo) == f"{fifo}:1: is not a regular file (a FIFO, socket or device is never read)"
    assert "is not a regular file" in error_of(Path("/dev/zero"))


def test_oversized_file_is_refused_before_reading(tmp_path: Path) -> None:
    path = tmp_path / "big.yaml"
    path.write_text(GOOD + "#" * (1024 * 1024) + "\n")
    assert "larger than the 1048576-byte limit" in error_of(path)


def test_duplicate_keys_are_errors_not_last_wins(write_campaign: Callable[[str], Path]) -> None:
    path = write_campaign(GOOD + "name: other\n")
    assert error_of(path) == f"{path}:6: key 'name' is given twice (also line 1)"


@pytest.mark.parametrize("value", [".inf", "-.inf", ".nan", "1e400"])
def test_non_finite_numbers_are_refused(write_campaign: Callable[[str], Path], value: str) -> None:
    path = write_campaign(GOOD + f"defaults: {{timeout_s: {value}}}\n")
    line = error_of(path)
    assert line.startswith(f"{path}:6: ")
    assert "finite" in line


def test_repeats_and_timeout_are_bounded(write_campaign: Callable[[str], Path]) -> None:
    path = write_campaign(GOOD + "defaults: {repeats: 100000000, timeout_s: 1e9}\n")
    with pytest.raises(SpecError) as info:
        load_campaign(path)
    assert f"{path}:6: defaults.repeats: must be <= 1000" in info.value.lines
    assert f"{path}:6: defaults.timeout_s: must be <= 604800" in info.value.lines


def test_trial_count_is_capped(write_campaign: Callable[[str], Path]) -> None:
    exps = "".join(f"  - {{kind: selftest, name: e{i}, modes: [noop, sleep], repeats: 1000}}\n" for i in range(6))
    path = write_campaign(GOOD.split("experiments:", maxsplit=1)[0] + "experiments:\n" + exps)
    started = time.monotonic()
    with pytest.raises(SpecError) as info:
        expand(load_campaign(path))
    assert time.monotonic() - started < 5
    assert "expands to 12000 trials" in info.value.lines[0]


def test_long_name_is_a_validation_error_not_enametoolong(write_campaign: Callable[[str], Path]) -> None:
    path = write_campaign(GOOD.replace("name: demo", "name: " + "a" * 5000))
    assert error_of(path) == f"{path}:1: name: String should have at most 64 characters"


@pytest.mark.parametrize(("remote_dir", "expected"), [
    ("''", "must be an absolute path"),
    ("work", "must be an absolute path"),
    ("/", "must not be /"),
    ("/tmp/../etc", "without '.', '..'"),
])
def test_remote_dir_must_be_a_plain_absolute_path(write_campaign: Callable[[str], Path], remote_dir: str,
                                                  expected: str) -> None:
    path = write_campaign(GOOD + f"remote_dir: {remote_dir}\n")
    assert expected in error_of(path)


def test_inventory_that_is_not_one_is_refused(write_campaign: Callable[[str], Path]) -> None:
    path = write_campaign(GOOD.replace("inventory: inventory", "inventory: /etc/passwd"))
    line = error_of(path)
    assert line == (f"{path}:2: inventory: inventory /etc/passwd: no inventory plugin (host_list, yaml, ini, toml) "
                    "could read it (`ansible-inventory -i /etc/passwd --list` says why)")  # its content never shown


@pytest.mark.parametrize("pattern", ["'['", "'all['", "'web[0'", "'~('", "'!'"])
def test_malformed_host_pattern_matches_nothing_instead_of_everything(write_campaign: Callable[[str], Path],
                                                                       pattern: str) -> None:
    path = write_campaign(GOOD + f"hosts: {pattern}\n")
    assert error_of(path).startswith(f"{path}:6: hosts: host pattern term")


def test_integer_key_is_reported_at_its_own_line(write_campaign: Callable[[str], Path]) -> None:
    path = write_campaign(GOOD + "engine:\n  model: m\n  env:\n    1: x\n")
    assert error_of(path).startswith(f"{path}:9: engine.env")


@pytest.mark.parametrize(("block", "where"), [
    ("  env: {HF_TOKEN: hf_planted}\n", "engine.env: HF_TOKEN looks like a credential"),
    ("  env: {DB_PASS: hunter2}\n", "engine.env: DB_PASS looks like a credential"),
    ("  args: {hf-token: hf_planted}\n", "engine.args: --hf-token takes a credential"),
])
def test_literal_credentials_are_refused(write_campaign: Callable[[str], Path], block: str, where: str) -> None:
    path = write_campaign(GOOD + "engine:\n  model: m\n" + block)
    assert where in error_of(path)


def test_token_counts_are_not_credentials(write_campaign: Callable[[str], Path]) -> None:
    path = write_campaign(GOOD + "engine:\n  model: m\n  env: {STANDIN_OFFLOAD_BYTES_PER_TOKEN: '2', MAX_TOKENS: '8'}\n"
                          "  env_from_controller: [HF_TOKEN]\n")
    engine = load_campaign(path).campaign.engine
    assert engine is not None and engine.env_from_controller == ["HF_TOKEN"]


@pytest.mark.parametrize("block", ["description: &a [*a]\n", "engine: &e {model: m, args: *e}\n",
                                   "description: &a [[[x, *a]]]\n"])
def test_an_alias_inside_what_it_names_is_refused_not_expanded_forever(write_campaign: Callable[[str], Path],
                                                                       block: str) -> None:
    # PyYAML builds a list that holds itself: the bounds walked it without end (a hang, memory growing).
    path = write_campaign(GOOD + block)
    started = time.monotonic()
    assert error_of(path).startswith(f"{path}:6: an alias names the mapping or list it is inside (a cycle")
    assert time.monotonic() - started < 2


def test_an_alias_used_twice_is_no_cycle(write_campaign: Callable[[str], Path]) -> None:
    path = write_campaign(GOOD.replace("modes: [noop]", "modes: {noop: &p {}, skip: {reason: x}}\n"
                                       "    engine_args: {a: &l [1, 2], b: *l}"))
    assert load_campaign(path).campaign.experiments[0].engine_args == {"a": [1, 2], "b": [1, 2]}


def test_a_pipe_named_through_proc_is_a_pipe_not_a_kernel_file(capsys: pytest.CaptureFixture[str]) -> None:
    # `cat c.yaml | python -m runner /dev/stdin` resolves into /proc/<pid>/fd and was called a kernel file.
    from runner.cli import main

    read_end, write_end = os.pipe()
    try:
        assert main([f"/proc/self/fd/{read_end}", "--plan"]) == 2
    finally:
        os.close(read_end)
        os.close(write_end)
    err = capsys.readouterr().err
    assert "is not a regular file (a FIFO" in err and "kernel file" not in err, err


@pytest.mark.parametrize("option", [[], ["-e"], ["-l"]])
def test_a_kernel_file_is_never_read_as_input(write_campaign: Callable[[str], Path], option: list[str],
                                              capsys: pytest.CaptureFixture[str]) -> None:
    # /proc/kmsg is a regular file whose read waits for the kernel's next message (the run hung),
    # and hands each message to one reader only: nothing under /proc or /sys is read as input.
    from runner.cli import main

    kernel = "/proc/self/status"  # the same file system; harmless to name
    argv = [kernel, "--plan"] if not option else [str(write_campaign(GOOD)), "--plan", *option, f"@{kernel}"]
    assert main(argv) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "a kernel file (/proc, /sys)" in err[0], err
    assert err[0].startswith({"-e": f"-e @{kernel}:1: ", "-l": f"-l @{kernel}: limit file "}.get(
        option[0] if option else "", f"{kernel}:1: "))


def test_a_read_that_would_wait_is_an_error_not_a_hang() -> None:
    """What keeps a file that waits (a kernel file under another mount of /proc) from hanging a
    reader: the file is opened without waiting, and a read that would wait raises."""
    from runner.files import _NoWaitFile

    read_end, write_end = os.pipe()
    os.set_blocking(read_end, False)
    with _NoWaitFile(read_end, "rb", closefd=True) as fh:
        for read in (lambda: fh.read(10), fh.readall, lambda: fh.readinto(bytearray(10))):
            with pytest.raises(BlockingIOError, match="would wait"):
                read()
    os.close(write_end)


@pytest.mark.parametrize("block", ['  env: {X: "a\\ud800"}\n', '  args: {chat-template: "\\udcff"}\n',
                                   '  env: {X: "\\ud83d\\ude00"}\n'])
def test_half_a_utf16_pair_is_refused_at_its_line(write_campaign: Callable[[str], Path], block: str) -> None:
    # --plan passed it; every trial then failed where Ansible read its variables (rc=4).
    path = write_campaign(GOOD + "engine:\n  model: m\n" + block)
    assert error_of(path).startswith(f"{path}:8: holds a \\ud800-\\udfff escape: half a UTF-16 pair")


OFFLOAD = Path(__file__).resolve().parents[3] / "campaigns" / "offload-local.yaml"


@pytest.mark.parametrize(("mode", "key", "value", "bound"), [
    ("hbm_only", "engine_copies", "10" * 9, "must be <= 64"),  # planned a port and a GPU share per copy: a hang
    ("native_cpu", "offload_gib", "1e300", "must be <= 1073741824"),  # int(inf) in the sizing: exit 5
    ("tiered", "fs_gib", "1e300", "must be <= 1073741824"),
    ("hbm_only", "workload.sessions", "10" * 9, "must be <= 100000"),  # passed the plan, for the node to build
    ("hbm_only", "quality.doc_tokens", "10" * 9, "must be <= 10000000"),
    ("hbm_only", "ready_timeout_s", "1e300", "must be <= 604800"),
])
def test_offload_parameters_are_bounded(tmp_path: Path, capsys: pytest.CaptureFixture[str], mode: str, key: str,
                                        value: str, bound: str) -> None:
    from runner.cli import main

    started = time.monotonic()
    option = f"experiments.1.modes.{mode}.{key}={value}"
    assert main([str(OFFLOAD), "--plan", "--only", f"offload.{mode}", "-e", option,
                 "--results", str(tmp_path / "results")]) == 2
    assert time.monotonic() - started < 10
    assert capsys.readouterr().err.splitlines() == [f"-e {option}: experiments[1].modes.{mode}.{key}: {bound}"]


def test_offload_copies_past_the_last_port_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from runner.cli import main

    assert main([str(OFFLOAD), "--plan", "--only", "offload.hbm_only", "-e", "engine.port=65535",
                 "-e", "experiments.1.modes.hbm_only.engine_copies=2", "--results", str(tmp_path / "results")]) == 3
    assert "refused: engine_copies: 2 copies listen on ports 65535-65536, past 65535: lower engine.port" in \
        capsys.readouterr().out


@pytest.mark.parametrize(("block", "expected"), [
    ("modes: {sleep: {seconds: 1e300}}", "experiments[0].modes.sleep.seconds: must be <= 604800"),
    ("modes: [noop]\n    engine_args: {}\nengine: {model: m, gpus: [100000]}", "engine.gpus[0]: must be <= 1023"),
])
def test_selftest_seconds_and_gpu_indices_are_bounded(write_campaign: Callable[[str], Path], block: str,
                                                      expected: str) -> None:
    path = write_campaign(GOOD.replace("modes: [noop]", block))
    assert error_of(path).split(": ", 1)[1] == expected


@pytest.mark.parametrize(("block", "expected"), [
    ("defaults: {repeats: yes}\n", "defaults.repeats"),  # planned one repeat, silently
    ("defaults: {timeout_s: on}\n", "defaults.timeout_s"),
    ("engine: {model: m, port: true}\n", "engine.port"),
    ("engine: {model: m, gpus: [true]}\n", "engine.gpus"),
])
def test_true_or_false_is_no_number(write_campaign: Callable[[str], Path], block: str, expected: str) -> None:
    path = write_campaign(GOOD + block)
    assert error_of(path) == f"{path}:6: {expected}: must be a number, not true or false"


def test_true_or_false_is_no_mode_parameter_number(write_campaign: Callable[[str], Path]) -> None:
    path = write_campaign(GOOD.replace("modes: [noop]", "modes: {sleep: {seconds: true}}"))
    assert error_of(path).endswith("experiments[0].modes.sleep.seconds: must be a number, not true or false")


def test_flags_and_switches_still_take_true_and_false(write_campaign: Callable[[str], Path]) -> None:
    path = write_campaign(GOOD.replace("modes: [noop]", "modes: [noop]\n    engine_args: {enforce-eager: true}")
                          + "engine: {model: m, args: {enable-sleep-mode: false}}\n")
    loaded = load_campaign(path)
    assert loaded.campaign.experiments[0].engine_args == {"enforce-eager": True}
    assert loaded.campaign.engine is not None and loaded.campaign.engine.args == {"enable-sleep-mode": False}


@pytest.mark.parametrize(("block", "line", "message"), [
    ("description: !!python/object/apply:os.system ['id']\n", 6,
     "not valid YAML: could not determine a constructor for the tag "
     "'tag:yaml.org,2002:python/object/apply:os.system'"),
    ("engine:\n  model: m\n  <<: [1, 2]\n", 8, "not valid YAML: expected a mapping for merging, but found scalar"),
    ("engine:\n  model: m\n  ? [a, b]\n  : 1\n", 8, "not valid YAML: found unhashable key"),
    ("engine: {model: m, port: " + "9" * 5000 + "}\n", 6,
     "an integer of 5000 characters: no value a campaign holds is that long"),
    ("description: a\x07b\n", 6, "holds the character U+0007, which YAML does not allow (a control character)"),
])
def test_yaml_that_gives_no_data_is_named_at_its_line(write_campaign: Callable[[str], Path], block: str, line: int,
                                                      message: str) -> None:
    # Each was reported at line 1, most with PyYAML's multi-line text ("in "<unicode string>", line 6 ...").
    path = write_campaign(GOOD + block)
    assert error_of(path) == f"{path}:{line}: {message}"


def test_show_launch_never_sends_a_values_terminal_escape_to_the_terminal(
        write_campaign: Callable[[str], Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from runner.cli import main

    path = write_campaign(GOOD.replace("kind: selftest\n    modes: [noop]", "kind: startup\n    modes: [first_start]")
                          + 'engine: {model: m, env: {X: "\\e]0;pwn\\a"}}\n')
    assert main([str(path), "--plan", "--show-launch", "--results", str(tmp_path / "results")]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "X='\\x1b]0;pwn\\x07'" in out


def test_a_key_holding_a_bracket_is_named_at_its_line(write_campaign: Callable[[str], Path]) -> None:
    # pydantic's union members look like "dict[str,...]": a user's "foo[1]" was dropped as one,
    # and the error said "(top)" at line 1.
    path = write_campaign(GOOD.replace("modes: [noop]", 'modes: {sleep: {"sec[onds]": 1}}') + "foo[1]: 1\n")
    with pytest.raises(SpecError) as info:
        load_campaign(path)
    assert info.value.lines == [
        f"{path}:5: experiments[0].modes.sleep.sec[onds]: unknown key: did you mean 'seconds'?",
        f"{path}:6: foo[1]: unknown key"]


def test_bad_input_prints_a_bounded_number_of_lines(write_campaign: Callable[[str], Path],
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    from runner.cli import MAX_ERROR_LINES, main

    modes = ", ".join(f"m{i}" for i in range(5000))  # one line each: 5,000 lines on the terminal
    assert main([str(write_campaign(GOOD.replace("modes: [noop]", f"modes: [{modes}]"))), "--plan"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == MAX_ERROR_LINES + 1 and err[-1] == f"... and {5000 - MAX_ERROR_LINES} more problem(s) like these"


@pytest.mark.parametrize("value", ["0", "-1"])
def test_plan_refuses_a_parallel_the_run_refuses(write_campaign: Callable[[str], Path], value: str,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    from runner.cli import main

    assert main([str(write_campaign(GOOD)), "--plan", "--parallel", value]) == 2  # it planned, exit 0
    assert capsys.readouterr().err.splitlines() == [f"--parallel: must be >= 1, got {value}"]


@pytest.mark.parametrize(("args", "message"), [
    ("{port: 1}", "engine.args: --port is given by the runner, from engine.port: set that instead"),
    ("{--model: /other}", "engine.args: --model is given by the runner, from engine.model: set that instead"),
    ("{max_model_len: 10, max-model-len: 20}",
     "engine.args: --max-model-len is given twice ('max_model_len' and 'max-model-len'): vLLM would take the last"),
])
def test_flags_that_conflict_are_refused(write_campaign: Callable[[str], Path], args: str, message: str) -> None:
    # The engine got both (--port 8000 ... --port 1) and took the last: it listened where the runner never looked.
    path = write_campaign(GOOD + f"engine: {{model: m, args: {args}}}\n")
    assert error_of(path) == f"{path}:6: {message}"


@pytest.mark.parametrize("key", ["1", "~", "true"])
def test_a_flag_name_that_is_no_text_is_still_refused(write_campaign: Callable[[str], Path], key: str) -> None:
    path = write_campaign(GOOD + f"engine: {{model: m, args: {{{key}: 2}}}}\n")
    assert "Input should be a valid string" in error_of(path)


def test_a_flag_is_one_flag_however_it_is_spelled(write_campaign: Callable[[str], Path]) -> None:
    # An experiment's max_model_len was merged beside the engine's max-model-len (vLLM got both), and
    # "--load-format: dummy" slipped past the check that startup never runs on dummy weights.
    start = GOOD.replace("kind: selftest\n    modes: [noop]", "kind: startup\n    modes: [first_start]")
    path = write_campaign(start.replace("[first_start]", "[first_start]\n    engine_args: {max_model_len: 8192}")
                          + "engine: {model: m, args: {--max-model-len: 4096}}\n")
    (trial,) = expand(load_campaign(path)).trials
    assert trial.as_dict()["launch"]["argv"].count("--max-model-len") == 1
    assert trial.as_dict()["launch"]["argv"][-1] == "8192"
    path = write_campaign(start + "engine: {model: m, args: {--load-format: dummy}}\n")
    assert "kind startup cannot run with engine.args load-format dummy" in error_of(path)


def test_a_variable_from_the_file_and_the_controller_is_refused(write_campaign: Callable[[str], Path]) -> None:
    # Both reached the node, and one of them won without a word.
    path = write_campaign(GOOD + "engine: {model: m, env: {TOKENS: '1'}, env_from_controller: [TOKENS]}\n")
    assert error_of(path) == f"{path}:6: engine: TOKENS is in engine.env and in engine.env_from_controller: keep one"


def test_an_override_replaces_the_flag_however_either_side_spells_it(write_campaign: Callable[[str], Path]) -> None:
    # -e engine.args.max_model_len=4096 over the file's max-model-len was refused as the flag given twice.
    start = GOOD.replace("kind: selftest\n    modes: [noop]", "kind: startup\n    modes: [first_start]")
    path = write_campaign(start + "engine: {model: m, args: {max-model-len: 16384}}\n")
    for key in ("engine.args.max_model_len=4096", "engine.args.--max-model-len=4096"):
        (trial,) = expand(load_campaign(path, overrides=parse_overrides([key]))).trials
        argv = trial.as_dict()["launch"]["argv"]
        assert argv.count("--max-model-len") == 1 and argv[argv.index("--max-model-len") + 1] == "4096"


def test_a_config_field_after_the_dot_keeps_its_underscores() -> None:
    # vLLM's parser turns _ into - only between the -- and the first dot: after it is a config field.
    assert flag_name("compilation_config.cudagraph_capture_sizes") == "compilation-config.cudagraph_capture_sizes"
    assert flag_name("--max_model_len") == "max-model-len"
