"""The command blocks of README.md and of every docs/*.md page run as written, each section's in order, as a reader
would run them from the repository's root after the set-up; where a page shows what a command prints, those lines
come out. The convention, which a reader sees in every page, and the machinery are tests/harness/doc_commands.py's (the
```python blocks are tests/project/test_readme.py's). The pages' own structure is checked here too: every block runs or
says why not, docs/README.md names every page of docs/, and the links between pages lead somewhere."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np
import pytest
from doc_commands import (
    DATA,
    DOCS,
    FENCE,
    README,
    SHELLS,
    all_command_blocks,
    command_blocks,
    output_faults,
    page_name,
    pages,
    run_blocks,
    run_sections,
    sections,
)

# ---- the pages' blocks ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("page", pages(), ids=page_name)
def test_every_command_block_is_run_or_says_why_not(page):
    text = page.read_text(encoding="utf-8")
    kinds = {m.group(1) for m in FENCE.finditer(text)}
    assert kinds <= {"", "python", *SHELLS, *DATA}, (
        f"{page_name(page)}: blocks of a kind no test knows: {kinds}"
    )
    for b in command_blocks(text, page_name(page)):
        if b.not_run is not None:
            assert len(b.not_run) >= 10, f"{b.page} line {b.line}: say why the block is not run"
        # the placeholders of real machines never run here, and are marked so
        if "SERVER" in b.code or "flwr run" in b.code:
            assert b.not_run, f"{b.page} line {b.line} needs machines of your own: mark it"


def test_the_readme_runs_its_examples_and_shows_what_they_print():
    blocks = all_command_blocks()
    run = [b for b in blocks if b.not_run is None]
    skipped = [b for b in blocks if b.not_run is not None]
    assert len(run) >= 5 and len(skipped) >= 3, [(b.page, b.line, b.not_run) for b in blocks]
    # the examples whose output the README shows are run and checked: the main job and each user's example
    shown = [b.code for b in run if b.output is not None and b.page == "README.md"]
    for command in ("edgetrain demo", "convert-inference-model", "android_demo simulate", "federate"):
        assert any(command in code for code in shown), command
    # the two test tiers are the README's commands (not run here: they are the test command)
    tiers = [b.code.strip() for b in skipped if b.page == "README.md"]
    assert "bash tools/test.sh --quick" in tiers and "bash tools/test.sh" in tiers, tiers


def test_docs_readme_is_the_index_of_docs():
    index = (DOCS / "README.md").read_text(encoding="utf-8")
    named = set(re.findall(r"\]\(([^)\s]+)\)", index))
    for page in sorted(DOCS.glob("*.md")):
        if page.name != "README.md":
            assert page.name in named, f"docs/README.md does not name docs/{page.name}"
    assert "docs/README.md" in README.read_text(encoding="utf-8"), (
        "the README's map does not lead to docs/README.md"
    )


@pytest.mark.parametrize("page", pages(), ids=page_name)
def test_the_links_of_a_page_lead_to_files(page):
    text = page.read_text(encoding="utf-8")
    targets = re.findall(r"\]\(([^)\s#]+)(?:#[^)]*)?\)", text) + re.findall(r'<img src="([^"]+)"', text)
    local = [t for t in targets if not re.match(r"[a-z]+:", t)]  # https:, mailto: lead elsewhere
    missing = [t for t in local if not (page.parent / t).exists()]
    assert not missing, f"{page_name(page)} links to files that are not there: {missing}"


# ---- the machinery --------------------------------------------------------------------------------------------


def test_the_check_fails_on_a_failing_block_and_on_output_that_does_not_come_out(tmp_path):
    text = (
        "intro\n\n```sh\necho made > made.txt\n```\n\n```sh\ntrue\nls missing-file\necho never\n```\n\n"
        "<!-- not run by tests: a machine of your own -->\n```sh\nexit 7\n```\n\n"
        "```sh\necho 'accuracy 10.0% -> 12.5%'; echo 'round 2/3: 50 s'\n```\n\n"
        "```\nround 1/3: ... minutes\naccuracy 3.0% -> 4.0%\n```\n\n"
        "```sh\necho 'accuracy 50.0% -> 40.0%'\n```\n\n```\naccuracy 50.0% -> ...\n```\n"
    )
    blocks = command_blocks(text)
    assert [b.not_run for b in blocks] == [None, None, "a machine of your own", None, None]
    faults = run_blocks(blocks, tmp_path, Path(sys.prefix))
    assert (tmp_path / "made.txt").read_text() == "made\n"
    assert len(faults) == 3, faults
    assert "line 7: exit 2" in faults[0] and "ls missing-file" in faults[0] and "never" not in faults[0]
    assert "line 18" in faults[1] and "'round 1/3: ... minutes'" in faults[1]
    assert "line 27" in faults[2] and "did not: 50.0% -> 40.0%" in faults[2]


def test_a_shown_duration_stands_for_any_duration():
    shown = "LoRA      90 steps in 14 s (median step 109 ms): top-1 6.7% -> 21.8%\ndone in 7:36."
    assert not output_faults(
        shown, "LoRA 90 steps in 1:08 (median step 550 ms): top-1 6.7% -> 21.8%\ndone in 9.5 s."
    )
    faults = output_faults(
        shown, "LoRA 90 steps in 14 samples (median step 5 ms): top-1 6.7% -> 21.8%\ndone in 1:02:03."
    )
    assert len(faults) == 1 and "'LoRA      90 steps in 14 s" in faults[0], faults


def test_sections_run_apart_and_may_not_make_the_same_names(tmp_path):
    text = (
        "# one\n\n```sh\necho a > a.txt; echo shared > both.txt\n```\n\n```sh\ncat a.txt\n```\n\n```\na\n```\n\n"
        "```python\n# a comment, no heading\n```\n\n```sh\ntrue\n```\n\n"
        "## two\n\n```sh\ncat a.txt\n```\n\n### three\n\n```sh\necho again > both.txt\n```\n"
    )
    blocks = command_blocks(text)
    assert [b.section for b in blocks] == ["one", "one", "one", "two", "three"]
    outputs: dict[int, str] = {}
    faults, folders = run_sections(blocks, tmp_path, Path(sys.prefix), workers=3, outputs=outputs)
    assert len(folders) == 3 and (folders[0] / "a.txt").exists() and not (folders[1] / "a.txt").exists()
    assert outputs["README.md", 7] == "a\n"  # state carries within a section
    assert len(faults) == 2, faults
    assert "line 25: exit 1" in faults[0] and "a.txt" in faults[0]  # a section sees no other's files
    assert "'one' and 'three' both make 'both.txt'" in faults[1]


@pytest.mark.slow
def test_the_readme_and_docs_commands_run_as_written(tmp_path):
    venv = Path(sys.prefix)
    if not (venv / "bin" / "edgetrain").exists():
        pytest.skip(f"the pages' commands run in the set-up's venv; {sys.prefix} has no bin/edgetrain")
    pytest.importorskip(
        "flwr", reason="the README's federated example needs the extra 'federated' (in 'dev')"
    )
    blocks = all_command_blocks()
    outputs: dict[tuple[str, int], str] = {}
    # every section of every page at once: the longest (the keyboard demo, the federated run) set the time
    faults, folders = run_sections(blocks, tmp_path, venv, outputs=outputs)
    assert not faults, "\n\n".join(faults)
    made = {(bs[0].page, p.name): f for bs, f in zip(sections(blocks).values(), folders) for p in f.iterdir()}
    # what the pages say their examples leave behind
    for page, path in (
        ("README.md", "edgetrain-demo/summary.json"),
        ("README.md", "lenet-personal.onnx"),
        ("README.md", "federated/accuracy.png"),
        ("docs/adapters.md", "edgetrain-demo-keyboard/summary.json"),
        ("docs/cli.md", "personalized.onnx"),
        ("docs/memory.md", "budget.etrain"),
        ("docs/phone.md", "kb/versions/v000001.etad"),
    ):
        assert (made[page, path.split("/")[0]] / path).stat().st_size > 0, (page, path)
    # the federated plot draws each of the 3 clients in its own color (matplotlib's C0, C1, C2), and the global
    # model as a grey band under them; no fourth client
    png = made["README.md", "federated"] / "federated" / "accuracy.png"
    drawn = pixels_of(png, CLIENT_COLORS)
    assert all(n > 300 for n in drawn[:3]) and drawn[3] == 0, drawn
    assert pixels_of(png, [GLOBAL_BAND])[0] > 2000
    # the keyboard demo's figures (its table's first six columns, not the timings) are the same on every run:
    # the page's are this default run's, exactly
    keyboard = next(b for b in blocks if b.code.strip() == ".venv/bin/edgetrain demo --model keyboard")
    assert keyboard.page == "docs/adapters.md"
    assert keyboard_table(outputs[keyboard.key]) == keyboard_table(keyboard.output)


def keyboard_table(text: str) -> dict[str, list[str]]:
    """The keyboard table's rows (label -> the figure cells before the timings) in demo output or its page."""
    rows = {}
    for label in ("base model", "LoRA r8 (attn, MLP)", "head-only", "full"):
        m = re.search(rf"^  {re.escape(label)} +(\d+\.\d% .+)$", text, re.M)  # a table row: top-1 first
        assert m, label
        rows[label] = m.group(1).split()[:6]
    return rows


CLIENT_COLORS = [(31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40)]  # matplotlib's C0..C3
GLOBAL_BAND = (201, 201, 201)  # grey 0.3 at alpha 0.3 on white


def pixels_of(png: Path, colors: list[tuple[int, int, int]]) -> list[int]:
    """How many pixels of the picture have each color (within a few levels)."""
    import matplotlib.image  # the demo extra's, as the plot itself

    rgb = np.round(matplotlib.image.imread(png)[..., :3] * 255).astype(int)
    return [int((np.abs(rgb - np.array(c)).max(axis=-1) <= 12).sum()) for c in colors]
