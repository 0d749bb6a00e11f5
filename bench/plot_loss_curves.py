"""Draws loss curves from --metrics-jsonl files as an SVG (standard library only).

    python3 bench/plot_loss_curves.py OUT.svg "TITLE" LABEL=FILE.jsonl [LABEL=FILE.jsonl ...]
"""
import json
import sys


def main():
    out, title, series = sys.argv[1], sys.argv[2], []
    for arg in sys.argv[3:]:
        label, path = arg.split("=", 1)
        with open(path) as f:
            series.append((label, [(r["iteration"], r["lm_loss"]) for r in map(json.loads, f)]))
    width, height, left, right, top, bottom = 720, 420, 60, 20, 40, 50
    xs = [x for _, pts in series for x, _ in pts]
    ys = [y for _, pts in series for _, y in pts]
    x0, x1, y0, y1 = min(xs), max(xs), min(ys), max(ys)
    sx = lambda x: left + (x - x0) / (x1 - x0) * (width - left - right)
    sy = lambda y: top + (y1 - y) / (y1 - y0) * (height - top - bottom)
    colors = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd"]
    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="12">',
           f'<rect width="{width}" height="{height}" fill="white"/>',
           f'<text x="{width / 2}" y="20" text-anchor="middle" font-size="14">{title}</text>']
    for i in range(6):
        y = y0 + (y1 - y0) * i / 5
        svg.append(f'<line x1="{left}" x2="{width - right}" y1="{sy(y):.1f}" y2="{sy(y):.1f}" stroke="#ddd"/>')
        svg.append(f'<text x="{left - 6}" y="{sy(y) + 4:.1f}" text-anchor="end">{y:.1f}</text>')
    for i in range(5):
        x = x0 + (x1 - x0) * i / 4
        svg.append(f'<text x="{sx(x):.1f}" y="{height - bottom + 18}" text-anchor="middle">{x:.0f}</text>')
    svg.append(f'<text x="{width / 2}" y="{height - 10}" text-anchor="middle">iteration</text>')
    svg.append(f'<text x="14" y="{height / 2}" transform="rotate(-90 14 {height / 2})" text-anchor="middle">lm loss</text>')
    for k, (label, pts) in enumerate(series):
        path = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in pts)
        svg.append(f'<polyline fill="none" stroke="{colors[k % 4]}" stroke-width="1.2" points="{path}"/>')
        svg.append(f'<text x="{width - right - 150}" y="{top + 20 + 16 * k}" fill="{colors[k % 4]}">{label}</text>')
    svg.append("</svg>")
    with open(out, "w") as f:
        f.write("\n".join(svg) + "\n")


if __name__ == "__main__":
    main()
