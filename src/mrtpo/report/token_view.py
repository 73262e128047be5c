"""The token-credit view: each token of a completion shaded by each reward's weight (HTML).

One card per completion; inside it one row per reward (plus the final advantage), every token a
cell whose colour says how much of that reward's credit it received: white at weight 1 (an even
share), orange above, blue below. Each row's colours are scaled to the weights present in that
row (the default weights live in about [0.8, 1.2]: scaled to [0, 2] they would all look white),
on a log scale each side of 1, and the row carries a colour bar labelled with the weights its
swatches stand for. Rows wrap. A reward with no spread in its group (every completion scored the
same: its advantage is 0, so it moves no token) says "skipped (no spread)" instead of looking
uniform. Hovering a token shows its weight and relevance. The page is self-contained.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

#: End colours of the weight scale (above / below 1) and of the advantage (positive / negative).
HIGH, LOW = (240, 120, 20), (50, 110, 215)
POSITIVE, NEGATIVE = (40, 160, 70), (210, 50, 50)
SKIPPED_BG = "#e4e4e4"


@dataclass
class CreditRow:
    """One reward's view of a completion: its reward value, per-token weights and relevance.

    ``skipped``: the reward had no spread in the completion's group (so no credit at all)."""

    name: str
    reward: float | None
    weights: Sequence[float]
    relevance: Sequence[float] | None = None
    evidence: str | None = None  # "in_prompt" / "privileged" / None (uniform)
    skipped: bool = False


@dataclass
class CompletionView:
    """A completion's tokens and its rows. ``advantage`` is the final per-token advantage."""

    title: str
    tokens: Sequence[str]
    rows: list[CreditRow]
    advantage: Sequence[float] | None = None
    notes: dict[str, str] = field(default_factory=dict)


def _mix(rgb: tuple[int, int, int], t: float) -> str:
    """``#rrggbb`` between white (``t = 0``) and ``rgb`` (``t = 1``)."""
    t = min(max(t, 0.0), 1.0)
    return "#" + "".join(f"{round(255 + (c - 255) * t):02x}" for c in rgb)


@dataclass(frozen=True)
class WeightScale:
    """Colours for weights in ``[low, high]`` (``low <= 1 <= high``): white at 1, full orange at
    ``high``, full blue at ``low``, by ``log w / log high`` (resp. ``low``) in between."""

    low: float
    high: float

    @classmethod
    def of(cls, weights: Sequence[float]) -> WeightScale:
        """The scale of the finite, positive weights present (1 if none)."""
        seen = [w for w in weights if math.isfinite(w) and w > 0]
        return cls(min(seen + [1.0]), max(seen + [1.0]))

    def intensity(self, w: float) -> float:
        """Signed share of the scale: ``+1`` at ``high``, ``-1`` at ``low``, 0 at 1."""
        if not math.isfinite(w) or w <= 0:
            return -1.0 if w <= 0 else 0.0
        if w >= 1.0:
            return math.log(w) / math.log(self.high) if self.high > 1.0 else 0.0
        return -math.log(w) / math.log(self.low) if self.low < 1.0 else 0.0

    def colour(self, w: float) -> str:
        if not math.isfinite(w):
            return "#eeeeee"
        t = self.intensity(w)
        return _mix(HIGH, t) if t >= 0 else _mix(LOW, -t)

    def ticks(self, per_side: int = 3) -> list[float]:
        """The weights the colour bar labels: ``per_side`` evenly spaced (in log) each side of 1."""
        below = [self.low ** (i / per_side) for i in range(per_side, 0, -1)] if self.low < 1.0 else []
        above = [self.high ** (i / per_side) for i in range(1, per_side + 1)] if self.high > 1.0 else []
        return [*below, 1.0, *above]


def _signed_colour(x: float, scale: float) -> str:
    t = min(abs(x) / max(scale, 1e-12), 1.0)
    return _mix(POSITIVE, t) if x >= 0 else _mix(NEGATIVE, t)


def _text_colour(t: float) -> str:
    return "#fff" if abs(t) > 0.75 else "#222"


def _swatch(background: str, text: str, t: float) -> str:
    return f"<span class='sw' style='background:{background};color:{_text_colour(t)}'>{html.escape(text)}</span>"


def weight_bar(scale: WeightScale) -> str:
    """The colour bar of a row: a swatch per tick of ``scale``, each labelled with its weight."""
    if scale.low == scale.high == 1.0:
        return ""
    digits = 2 if scale.high - scale.low >= 0.1 else 3
    cells = [_swatch(scale.colour(w), f"{w:.{digits}f}", scale.intensity(w)) for w in scale.ticks()]
    return f"<div class='bar' title='token weight: colour scale of this row'>{''.join(cells)}</div>"


def advantage_bar(scale: float) -> str:
    """The advantage row's colour bar: ``-scale … 0 … +scale`` in five labelled swatches."""
    if scale <= 0:
        return ""
    cells = [
        _swatch(_signed_colour(x, scale), f"{x:+.3g}", x / scale) for x in (-scale, -scale / 2, 0.0, scale / 2, scale)
    ]
    return f"<div class='bar' title='advantage: colour scale of this row'>{''.join(cells)}</div>"


def _token_text(tok: str) -> str:
    shown = tok.replace("\n", "↵").replace("\t", "⇥")
    return html.escape(shown if shown else "∅")


CSS = """
body{font-family:system-ui,sans-serif;margin:24px;color:#222;max-width:1200px}
.card{border:1px solid #ddd;border-radius:8px;padding:12px 16px;margin:16px 0}
.row{display:flex;align-items:flex-start;margin:8px 0;gap:10px}
.label{flex:0 0 210px;font-size:13px;padding-top:3px}
.label small{color:#666;display:block}
.label .skip{color:#a33;font-weight:600}
.tokens{font-family:ui-monospace,monospace;font-size:13px;line-height:1.9;flex:1;min-width:0;
white-space:pre-wrap;overflow-wrap:anywhere}
.tok{padding:1px 0;border-radius:2px;white-space:pre-wrap}
.skipped .tok{background:repeating-linear-gradient(45deg,#eee,#eee 4px,#ddd 4px,#ddd 8px);color:#777}
.bar{display:flex;margin-top:4px;font-size:10px;font-family:ui-monospace,monospace}
.sw{flex:1;text-align:center;padding:2px 0;border:1px solid #ccc;margin-right:-1px}
.legend{font-size:13px}
.notes{font-size:12px;color:#555}
"""


def _row(name: str, sub: str, bar: str, cells: Sequence[str], css: str = "", skip: str = "") -> str:
    skip = f"<small class='skip'>{html.escape(skip)}</small>" if skip else ""
    return (
        f"<div class='row{css}'><div class='label'><b>{html.escape(name)}</b>{skip}<small>{html.escape(sub)}"
        f"</small>{bar}</div><div class='tokens'>{''.join(cells)}</div></div>"
    )


def _reward_row(view: CompletionView, row: CreditRow) -> str:
    unscored = row.reward is None or (isinstance(row.reward, float) and math.isnan(row.reward))
    reward = "n/a" if unscored else f"{row.reward:g}"
    scale = WeightScale.of(row.weights)
    uniform = scale.low == scale.high == 1.0
    sub = f"reward {reward} · {row.evidence or 'no evidence (uniform)'}"
    if uniform and not row.skipped:
        sub += " · every weight 1"
    cells = []
    for i, (tok, w) in enumerate(zip(view.tokens, row.weights)):
        tip = f"{row.name} · token {i} {tok!r}: weight {w:.3f}"
        if row.relevance is not None:
            tip += f", relevance {row.relevance[i]:.4f}"
        style = "" if row.skipped else f" style='background:{scale.colour(w)}'"
        cells.append(f"<span class='tok'{style} title='{html.escape(tip, quote=True)}'>{_token_text(tok)}</span>")
    if row.skipped:
        return _row(row.name, sub, "", cells, " skipped", "skipped (no spread)")
    return _row(row.name, sub, weight_bar(scale), cells)


def render_cards(views: Sequence[CompletionView], legend: bool = True) -> str:
    """The legend (unless ``legend`` is False) and one card per completion, as an HTML fragment
    (needs :data:`CSS`). For pages that embed the view among other content (the training report)."""
    parts = (
        []
        if not legend
        else [
            "<p class='legend'>Token weight: white = 1 (an even share of the reward's credit), "
            f"<span style='background:{_mix(HIGH, 1)}'>&nbsp;orange&nbsp;</span> more, "
            f"<span style='background:{_mix(LOW, 1)};color:#fff'>&nbsp;blue&nbsp;</span> less; each row is scaled "
            "to its own weights (the bar under its name gives the numbers). Advantage: "
            f"<span style='background:{_mix(NEGATIVE, 1)};color:#fff'>&nbsp;negative&nbsp;</span> "
            f"<span style='background:{_mix(POSITIVE, 1)};color:#fff'>&nbsp;positive&nbsp;</span>. "
            "Hatched grey, <b>skipped (no spread)</b>: every completion of the prompt got the same value of that "
            "reward, so its advantage is 0 and it gives no token any credit.</p>"
        ]
    )
    for view in views:
        parts.append(f"<div class='card'><h3>{html.escape(view.title)}</h3>")
        if view.notes:
            notes = " · ".join(f"{html.escape(k)}: {html.escape(v)}" for k, v in view.notes.items())
            parts.append(f"<div class='notes'>{notes}</div>")
        parts += [_reward_row(view, row) for row in view.rows]
        if view.advantage is not None:
            scale = max([abs(a) for a in view.advantage if math.isfinite(a)] + [0.0])
            cells = [
                f"<span class='tok' style='background:{_signed_colour(a, scale)}' "
                f"title='{html.escape(f'advantage token {i} {tok!r}: {a:+.4f}', quote=True)}'>"
                f"{_token_text(tok)}</span>"
                for i, (tok, a) in enumerate(zip(view.tokens, view.advantage))
            ]
            sub = "per token, all rewards" if scale > 0 else "0 at every token: this completion moves nothing"
            parts.append(_row("advantage", sub, advantage_bar(scale), cells))
        parts.append("</div>")
    return "".join(parts)


def render_html(views: Sequence[CompletionView], title: str = "Token credit", intro: str = "") -> str:
    """A self-contained HTML page with one card per completion."""
    parts = [
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>",
        f"<style>{CSS}</style></head><body><h1>{html.escape(title)}</h1>",
    ]
    if intro:
        parts.append(f"<p>{html.escape(intro)}</p>")
    parts.append(render_cards(views))
    parts.append("</body></html>")
    return "".join(parts)


__all__ = [
    "CSS",
    "CompletionView",
    "CreditRow",
    "WeightScale",
    "advantage_bar",
    "render_cards",
    "render_html",
    "weight_bar",
]
