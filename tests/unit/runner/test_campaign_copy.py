"""The frozen campaign copy (results/<name>/campaign.yaml): its editor schema modeline points at
the same schema from where the copy is, or says it is gone; never at nothing. One line for one, so
a line number in a message about the original is the copy's too."""

from __future__ import annotations

from pathlib import Path

from runner.store import ResultsStore

REPO = Path(__file__).resolve().parents[3]
MODELINE = "# yaml-language-server: $schema=../schema/campaign.schema.json"
BODY = "---\nname: demo\nexperiments:\n  - kind: selftest\n"


def test_a_relative_modeline_points_at_the_same_schema_from_the_copy(tmp_path: Path) -> None:
    assert (REPO / "campaigns" / "local.yaml").read_text().startswith(MODELINE)  # the shipped campaigns carry it
    repo = tmp_path / "checkout"  # the repository's layout: campaigns/, schema/, results/ side by side
    (repo / "campaigns").mkdir(parents=True)
    (repo / "schema").mkdir()
    (repo / "schema" / "campaign.schema.json").write_text("{}")
    source = repo / "campaigns" / "local.yaml"
    for results in (repo / "results" / "demo", tmp_path / "elsewhere" / "deeper" / "demo"):
        copy = ResultsStore(results).freeze_campaign(MODELINE + "\n" + BODY, source)
        first, rest = copy.read_text().split("\n", 1)
        assert rest == BODY
        target = first.removeprefix("# yaml-language-server: $schema=")
        assert target != first and not target.startswith("/")
        assert (results / target).resolve() == repo / "schema" / "campaign.schema.json"
    assert first.endswith("$schema=../../../checkout/schema/campaign.schema.json")


def test_a_modeline_whose_schema_is_gone_becomes_a_note_and_a_url_stays(tmp_path: Path) -> None:
    (tmp_path / "campaigns").mkdir()
    source = tmp_path / "campaigns" / "c.yaml"
    store = ResultsStore(tmp_path / "results" / "demo")
    text = store.freeze_campaign(MODELINE + "\n" + BODY, source).read_text()
    assert text.splitlines()[0] == "# (schema modeline of the original, ../schema/campaign.schema.json, not found " \
                                   "from this copy)"
    assert len(text.splitlines()) == len((MODELINE + "\n" + BODY).splitlines())
    url = "# yaml-language-server: $schema=https://example.org/campaign.schema.json"
    assert store.freeze_campaign(url + "\n" + BODY, source).read_text() == url + "\n" + BODY
    assert store.freeze_campaign(BODY, source).read_text() == BODY
