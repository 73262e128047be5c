"""The token-credit view: each token of a completion shaded by each reward's weight (HTML).

One card per completion; inside it one row per reward (plus the final advantage), every token a
cell whose colour says how much of that reward's credit it received (weight 1 = an even share,
white; above 1 = more, orange; below 1 = less, blue). Hovering a token shows its weight and
relevance. The page is self-contained (no scripts, no external assets).
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass
class CreditRow:
    """One reward's view of a completion: its reward value, per-token weights and relevance."""

    name: str
    reward: float | None
    weights: Sequence[float]
    relevance: Sequence[float] | None = None
    evidence: str | None = None  # "in_prompt" / "privileged" / None (uniform)


@dataclass
class CompletionView:
    """A completion's tokens and its rows. ``advantage`` is the final per-token advantage."""

    title: str
    tokens: Sequence[str]
    rows: list[CreditRow]
    advantage: Sequence[float] | None = None
    notes: dict[str, str] = field(default_factory=dict)


def _weight_colour(w: float, w_top: float) -> str:
    """White at 1, orange towards ``w_top``, blue towards 0."""
    if not math.isfinite(w):
        return "#eeeeee"
    if w >= 1.0:
        a = min((w - 1.0) / max(w_top - 1.0, 1e-9), 1.0)
        return f"rgba(230, 120, 20, {0.08 + 0.85 * a:.3f})"
    a = min(1.0 - w, 1.0)
    return f"rgba(60, 110, 200, {0.6 * a:.3f})"


def _signed_colour(x: float, scale: float) -> str:
    a = min(abs(x) / max(scale, 1e-9), 1.0)
    return f"rgba(30, 150, 60, {0.8 * a:.3f})" if x >= 0 else f"rgba(200, 40, 40, {0.8 * a:.3f})"


def _token_text(tok: str) -> str:
    shown = tok.replace("\n", "↵").replace("\t", "⇥")
    return html.escape(shown if shown else "∅")


CSS = """
body{font-family:system-ui,sans-serif;margin:24px;color:#222}
.card{border:1px solid #ddd;border-radius:8px;padding:12px 16px;margin:16px 0}
.row{display:flex;align-items:flex-start;margin:6px 0}
.label{flex:0 0 190px;font-size:13px;padding-top:3px}
.label small{color:#777;display:block}
.tokens{font-family:ui-monospace,monospace;font-size:13px;line-height:1.9;flex:1}
.tok{padding:1px 0;border-radius:2px;white-space:pre}
.legend span{display:inline-block;padding:2px 8px;margin-right:6px;border-radius:3px;font-size:12px}
.notes{font-size:12px;color:#555}
"""


def render_cards(views: Sequence[CompletionView]) -> str:
    """The colour legend and one card per completion, as an HTML fragment (needs :data:`CSS`).

    For pages that embed the view among other content (the training report)."""
    parts = [(
        "<p class='legend'>weight: <span style='background:rgba(60,110,200,.6)'>0</span>"
        "<span style='background:#fff;border:1px solid #ddd'>1 (even share)</span>"
        "<span style='background:rgba(230,120,20,.93)'>highest</span> · advantage: "
        "<span style='background:rgba(200,40,40,.8)'>negative</span>"
        "<span style='background:rgba(30,150,60,.8)'>positive</span></p>"
    )]
    for view in views:
        parts.append(f"<div class='card'><h3>{html.escape(view.title)}</h3>")
        if view.notes:
            notes = " · ".join(f"{html.escape(k)}: {html.escape(v)}" for k, v in view.notes.items())
            parts.append(f"<div class='notes'>{notes}</div>")
        for row in view.rows:
            w_top = max([w for w in row.weights if math.isfinite(w)] + [1.0])
            unscored = row.reward is None or (isinstance(row.reward, float) and math.isnan(row.reward))
            reward = "n/a" if unscored else f"{row.reward:g}"
            sub = f"reward {reward} · {row.evidence or 'no evidence (uniform)'}"
            cells = []
            for i, (tok, w) in enumerate(zip(view.tokens, row.weights)):
                tip = f"{row.name} · token {i} {tok!r}: weight {w:.3f}"
                if row.relevance is not None:
                    tip += f", relevance {row.relevance[i]:.4f}"
                cells.append(f"<span class='tok' style='background:{_weight_colour(w, w_top)}' "
                             f"title='{html.escape(tip, quote=True)}'>{_token_text(tok)}</span>")
            parts.append(f"<div class='row'><div class='label'><b>{html.escape(row.name)}</b>"
                         f"<small>{html.escape(sub)}</small></div><div class='tokens'>{''.join(cells)}</div></div>")
        if view.advantage is not None:
            scale = max([abs(a) for a in view.advantage] + [1e-9])
            cells = [f"<span class='tok' style='background:{_signed_colour(a, scale)}' "
                     f"title='{html.escape(f'advantage token {i} {tok!r}: {a:+.4f}', quote=True)}'>"
                     f"{_token_text(tok)}</span>"
                     for i, (tok, a) in enumerate(zip(view.tokens, view.advantage))]
            parts.append(f"<div class='row'><div class='label'><b>advantage</b><small>per token, all rewards</small>"
                         f"</div><div class='tokens'>{''.join(cells)}</div></div>")
        parts.append("</div>")
    return "".join(parts)


def render_html(views: Sequence[CompletionView], title: str = "Token credit", intro: str = "") -> str:
    """A self-contained HTML page with one card per completion."""
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>",
             f"<style>{CSS}</style></head><body><h1>{html.escape(title)}</h1>"]
    if intro:
        parts.append(f"<p>{html.escape(intro)}</p>")
    parts.append(render_cards(views))
    parts.append("</body></html>")
    return "".join(parts)


__all__ = ["CSS", "CompletionView", "CreditRow", "render_cards", "render_html"]
