"""Hovering a learning curve or a parallel-coordinates line names the trial, its value and its
hyperparameters; clicking it opens the trial's page (real Chromium, see ``conftest``)."""

from __future__ import annotations

import math
from typing import Any

import pytest
from sqlalchemy import select

from hpc_master.db.engine import transaction
from hpc_master.db.models import MetricModel, TrialModel
from tests.webui.conftest import UiMaster
from tests.webui.test_browser import sessions_of, shot

pytestmark = [pytest.mark.browser]

# In the page: a column and a series whose point there is at least ``sep`` pixels (vertically) from
# every other series' nearest real point (what the cursor picks for them), so hovering it can only
# focus that series. Returns the trial's index in the chart, the value and the pixel in the overlay.
FIND_POINT = """(sep) => {
  const u = document.querySelector('#learning-curves').plot;
  const xs = u.data[0];
  const nearest = (ys, i) => {
    if (ys[i] != null) return i;
    for (let d = 1; d < ys.length; d++) {
      if (i - d >= 0 && ys[i - d] != null) return i - d;
      if (i + d < ys.length && ys[i + d] != null) return i + d;
    }
    return null;
  };
  for (let i = Math.floor(xs.length * 0.1); i < xs.length * 0.9; i++) {
    for (let k = 1; k < u.data.length; k++) {
      const v = u.data[k][i];
      if (v == null) continue;
      const y = u.valToPos(v, 'y');
      let ok = true;
      for (let o = 1; o < u.data.length && ok; o++) {
        if (o === k) continue;
        for (const j of [nearest(u.data[o], i), nearest(u.data[o].slice(0, i), i - 1)]) {
          if (j != null && Math.abs(u.valToPos(u.data[o][j], 'y') - y) < sep) ok = false;
        }
      }
      if (ok) return { series: k, value: v, x: u.valToPos(xs[i], 'x'), y };
    }
  }
  return null;
}"""

# A point on one parallel-coordinates line that no other line covers (checked with elementFromPoint).
FIND_LINE = """() => {
  for (const g of document.querySelectorAll('#pcoords g.trial')) {
    const path = g.querySelector('path.line');
    const len = path.getTotalLength();
    for (let f = 0.05; f < 1; f += 0.05) {
      const p = path.getPointAtLength(len * f);
      const r = path.ownerSVGElement.getBoundingClientRect();
      const x = r.left + p.x, y = r.top + p.y;
      const hit = document.elementFromPoint(x, y);
      if (hit && hit.closest('g.trial') === g) return { trial: Number(g.dataset.trial), x, y };
    }
  }
  return null;
}"""


def fmt(v: float) -> str:
    """The page's ``num()`` for a non-integer: 4 significant digits, exponent form outside [1e-3, 1e6)."""
    if v != 0 and (abs(v) < 1e-3 or abs(v) >= 1e6):
        mantissa, exponent = f"{v:.3e}".split("e")
        return f"{mantissa}e{int(exponent):+d}"
    return repr(float(f"{v:.4g}"))


def test_hover_and_click_learning_curve(ui_master: UiMaster, page_factory: Any) -> None:
    exp, trials = ui_master.data["asha"], ui_master.data["asha_trials"]
    ui = page_factory()
    p = ui.page
    ui.login("alice", "alice-pw")
    p.goto(f"/experiments/{exp}?group=training&metric=loss")
    p.wait_for_selector("#learning-curves[data-series='12']")
    point = p.evaluate(FIND_POINT, 12)
    assert point is not None, "no point on the chart stands apart from the other curves"
    trial_id = sorted(trials)[point["series"] - 1]  # series follow the trials sorted by id
    over = p.locator("#learning-curves .u-over").bounding_box()
    assert over is not None
    x, y = over["x"] + point["x"], over["y"] + point["y"]
    p.mouse.move(x - 20, y)
    p.mouse.move(x, y, steps=4)
    tooltip = p.locator("#learning-curves .tooltip")
    tooltip.wait_for(state="visible", timeout=2000)
    text = tooltip.inner_text()
    with transaction(sessions_of(ui_master)) as s:
        hparams = s.get(TrialModel, trial_id).hparams
        losses = [
            m["avgMetrics"]["loss"]
            for m in s.scalars(
                select(MetricModel.metrics).where(
                    MetricModel.trial_id == trial_id, MetricModel.group == "training"
                )
            )
        ]
    assert f"Trial {trial_id}" in text, text
    assert f"loss {fmt(point['value'])}" in text, text
    assert any(math.isclose(v, point["value"], rel_tol=1e-12) for v in losses)  # a real point, not a mean
    assert f"lr={fmt(hparams['lr'])}" in text and f"optimizer={hparams['optimizer']}" in text, text
    assert f"layers={hparams['layers']}" in text, text
    assert p.get_attribute("#learning-curves", "data-hover-trial") == str(trial_id)
    shot(p, "learning-curves")
    p.mouse.down()
    p.mouse.up()
    p.wait_for_url(f"**/trials/{trial_id}")
    p.wait_for_selector("#trial-charts canvas")
    ui.assert_clean()


def test_hover_and_click_parallel_coordinates(ui_master: UiMaster, page_factory: Any) -> None:
    exp = ui_master.data["asha"]
    ui = page_factory()
    p = ui.page
    ui.login("alice", "alice-pw")
    p.goto(f"/experiments/{exp}/hyperparameters")
    p.wait_for_selector("#pcoords g.trial")
    line = p.evaluate(FIND_LINE)
    assert line is not None
    p.mouse.move(line["x"], line["y"])
    tooltip = p.locator("#pcoords .tooltip")
    tooltip.wait_for(state="visible", timeout=2000)
    text = tooltip.inner_text()
    with transaction(sessions_of(ui_master)) as s:
        trial = s.get(TrialModel, line["trial"])
        hparams, best = trial.hparams, trial.best_validation
    assert f"Trial {line['trial']}" in text and f"validation_loss {fmt(best)}" in text, text
    assert f"lr={fmt(hparams['lr'])}" in text and f"optimizer={hparams['optimizer']}" in text, text
    shot(p, "hyperparameters")
    p.mouse.click(line["x"], line["y"])
    p.wait_for_url(f"**/trials/{line['trial']}")
    ui.assert_clean()
