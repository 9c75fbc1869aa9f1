"""`speckv simulate --report`: the HTML report says which speculative action
paid, as the console does: each action's orders and outcomes, and what it
measurably saved where a `-without-ACTION` run ran beside its policy."""
from __future__ import annotations

import html

from speckv.loadgen.experiments.report import ABLATION_TITLE, ACTIONS_TITLE
from speckv.loadgen.sim import cli


def test_the_report_holds_the_action_and_ablation_tables(tmp_path):
    report = tmp_path / "report"
    code = cli.main(["--synthetic", "document-bursts", "--nodes", "4", "--start-s", "600", "--duration-s", "20",
                     "--policies", "none,oracle,oracle-without-replicate", "--compiled", "off",
                     "--report", str(report)], {})
    assert code == 0
    page = (report / "nodes-4" / "index.html").read_text()
    actions, ablation = html.escape(ACTIONS_TITLE), html.escape(ABLATION_TITLE)
    assert actions in page and ablation in page
    action_part = page.split(actions)[1].split("</table>")[0]
    assert "<td>oracle</td><td>replicate</td>" in action_part  # the oracle copied ahead of the burst
    assert "bytes read after lease" in action_part
    ablation_part = page.split(ablation)[1].split("</table>")[0]
    assert "<td>oracle</td><td>replicate</td>" in ablation_part
