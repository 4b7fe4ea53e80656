#!/usr/bin/env python3
"""The step-against-floor curves of make bench as an SVG picture.

Reads rows "dim ctx ms_per_step floor_ms" (one per run, whitespace-separated) on
standard input and writes OUT.svg: for each context length, the step time (solid) and
its sgemm floor (dashed) against the model width, on log-log axes, so that the gap
between the two lines is the share of a step that is not matrix multiplication.

    python3 bench/plot_curves.py OUT.svg < rows
"""
import math
import sys

W, H, LEFT, RIGHT, TOP, BOTTOM = 680, 400, 70, 175, 40, 50
COLOURS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd"]


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__.strip().splitlines()[-1].strip())
    rows = [line.split() for line in sys.stdin if line.strip()]
    runs = [(int(d), int(c), float(ms), float(fl)) for d, c, ms, fl in rows if float(fl) > 0]
    if not runs:
        sys.exit("plot_curves: no rows with a floor")
    dims = sorted({r[0] for r in runs})
    ctxs = sorted({r[1] for r in runs})
    times = [t for r in runs for t in r[2:]]
    lo_x = math.log(dims[0])
    hi_x = math.log(dims[-1]) if len(dims) > 1 else lo_x + 1
    lo_y, hi_y = math.log(min(times)) - 0.1, math.log(max(times)) + 0.1

    def x(dim):
        return LEFT + (math.log(dim) - lo_x) / (hi_x - lo_x) * (W - LEFT - RIGHT)

    def y(ms):
        return H - BOTTOM - (math.log(ms) - lo_y) / (hi_y - lo_y) * (H - TOP - BOTTOM)

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" '
           f'font-family="sans-serif" font-size="12">',
           f'<rect width="{W}" height="{H}" fill="white"/>',
           f'<text x="{LEFT}" y="22" font-size="14">training step (solid) against its sgemm '
           f'floor (dashed), 1 rank, 1 thread</text>']
    for dim in dims:
        out.append(f'<line x1="{x(dim):.1f}" y1="{TOP}" x2="{x(dim):.1f}" y2="{H - BOTTOM}" '
                   f'stroke="#eee"/><text x="{x(dim):.1f}" y="{H - BOTTOM + 18}" '
                   f'text-anchor="middle">{dim}</text>')
    for e in range(math.floor(lo_y / math.log(10)), math.ceil(hi_y / math.log(10)) + 1):
        for m in (1, 2, 5):
            ms = m * 10.0 ** e
            if lo_y <= math.log(ms) <= hi_y:
                out.append(f'<line x1="{LEFT}" y1="{y(ms):.1f}" x2="{W - RIGHT}" '
                           f'y2="{y(ms):.1f}" stroke="#eee"/><text x="{LEFT - 6}" '
                           f'y="{y(ms) + 4:.1f}" text-anchor="end">{ms:g}</text>')
    out.append(f'<text x="{(LEFT + W - RIGHT) / 2}" y="{H - 12}" text-anchor="middle">'
               f'model width (dim)</text>')
    out.append(f'<text x="16" y="{(TOP + H - BOTTOM) / 2}" text-anchor="middle" '
               f'transform="rotate(-90 16 {(TOP + H - BOTTOM) / 2})">ms per step</text>')
    for i, ctx in enumerate(ctxs):
        colour = COLOURS[i % len(COLOURS)]
        mine = sorted(r for r in runs if r[1] == ctx)
        for column, dash in ((2, ""), (3, ' stroke-dasharray="5,4"')):
            points = " ".join(f"{x(r[0]):.1f},{y(r[column]):.1f}" for r in mine)
            out.append(f'<polyline points="{points}" fill="none" stroke="{colour}" '
                       f'stroke-width="2"{dash}/>')
        last = mine[-1]
        out.append(f'<text x="{W - RIGHT + 8}" y="{y(last[2]) + 4:.1f}" fill="{colour}">ctx '
                   f'{ctx}: x{last[2] / last[3]:.2f} the floor</text>')
    out.append("</svg>")
    with open(sys.argv[1], "w") as f:
        f.write("\n".join(out) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
