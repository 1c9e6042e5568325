"""The test handlers' run log is read safely while handlers append to it."""

from tests.support.workers import RunLog


def test_a_half_written_last_line_is_not_read_yet(tmp_path):
    path = tmp_path / "log"
    path.write_text("start 1 1 10 1.5\nend 1 1 10 2.5\nsta")
    assert [e.kind for e in RunLog(path).events()] == ["start", "end"]
    path.write_text("")
    assert RunLog(path).events() == []
