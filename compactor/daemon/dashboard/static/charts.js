// SVG charts drawn from the dashboard's API: grouped bars, lines over time, a health bar.
"use strict";

(function () {
  const NS = "http://www.w3.org/2000/svg";

  function svg(tag, attributes, text) {
    const node = document.createElementNS(NS, tag);
    for (const [name, value] of Object.entries(attributes || {})) {
      node.setAttribute(name, String(value));
    }
    if (text !== undefined) node.textContent = text;
    return node;
  }

  function frame(width, height, label) {
    return svg("svg", {
      class: "chart", width, height, viewBox: `0 0 ${width} ${height}`, role: "img",
      "aria-label": label,
    });
  }

  function legend(series) {
    const box = document.createElement("div");
    box.className = "legend";
    series.forEach((s, i) => {
      const item = document.createElement("span");
      const swatch = document.createElement("span");
      swatch.className = `swatch series-${i}`;
      item.append(swatch, s.name);
      box.append(item);
    });
    return box;
  }

  function figure(caption, chart, series) {
    const fig = document.createElement("figure");
    fig.className = "chart";
    const title = document.createElement("figcaption");
    title.textContent = caption;
    fig.append(title, chart, legend(series));
    return fig;
  }

  // Grouped bars: one group per label, one bar per series ({name, values}).
  function bars(caption, labels, series) {
    const width = 640, height = 240, left = 44, bottom = 40, top = 10;
    const chart = frame(width, height, caption);
    const max = Math.max(1, ...series.flatMap((s) => s.values));
    const plotHeight = height - bottom - top;
    const groupWidth = (width - left - 10) / labels.length;
    const barWidth = Math.max(2, (groupWidth - 6) / series.length);
    chart.append(svg("line", { class: "axis", x1: left, y1: top + plotHeight, x2: width - 10, y2: top + plotHeight }));
    chart.append(svg("text", { x: left - 6, y: top + 8, "text-anchor": "end" }, String(max)));
    chart.append(svg("text", { x: left - 6, y: top + plotHeight, "text-anchor": "end" }, "0"));
    labels.forEach((label, g) => {
      const x0 = left + g * groupWidth + 3;
      series.forEach((s, i) => {
        const value = s.values[g];
        const h = (value / max) * plotHeight;
        const bar = svg("rect", {
          class: `bar series-${i}`, x: x0 + i * barWidth, y: top + plotHeight - h,
          width: barWidth - 1, height: h,
        });
        bar.append(svg("title", {}, `${s.name}, ${label}: ${value} files`));
        chart.append(bar);
      });
      chart.append(svg("text", {
        x: x0 + groupWidth / 2 - 3, y: height - bottom + 14, "text-anchor": "middle",
      }, label));
    });
    chart.append(svg("text", { x: left, y: height - 6 }, "file size (up to)"));
    return figure(caption, chart, series);
  }

  // Lines over time: times in epoch ms, one line per series ({name, values}, null = unknown).
  function lines(caption, times, series) {
    const width = 640, height = 240, left = 56, bottom = 30, top = 10, right = 10;
    const chart = frame(width, height, caption);
    const known = series.flatMap((s) => s.values.filter((v) => v !== null));
    const max = Math.max(1, ...known);
    const first = Math.min(...times), last = Math.max(...times);
    const span = Math.max(1, last - first);
    const plotWidth = width - left - right, plotHeight = height - bottom - top;
    const x = (t) => left + ((t - first) / span) * plotWidth;
    const y = (v) => top + plotHeight - (v / max) * plotHeight;
    chart.append(svg("line", { class: "axis", x1: left, y1: top + plotHeight, x2: width - right, y2: top + plotHeight }));
    chart.append(svg("text", { x: left - 6, y: top + 8, "text-anchor": "end" }, String(max)));
    chart.append(svg("text", { x: left - 6, y: top + plotHeight, "text-anchor": "end" }, "0"));
    chart.append(svg("text", { x: left, y: height - 8 }, new Date(first).toLocaleString()));
    chart.append(svg("text", { x: width - right, y: height - 8, "text-anchor": "end" }, new Date(last).toLocaleString()));
    series.forEach((s, i) => {
      const points = times.map((t, k) => [t, s.values[k]]).filter(([, v]) => v !== null);
      if (!points.length) return;
      // A step line: a count holds until the next snapshot changes it.
      let d = `M${x(points[0][0])},${y(points[0][1])}`;
      for (let k = 1; k < points.length; k++) {
        d += ` H${x(points[k][0])} V${y(points[k][1])}`;
      }
      chart.append(svg("path", { class: `line series-${i}`, d }));
      for (const [t, v] of points) {
        const dot = svg("circle", { class: `series-${i}`, cx: x(t), cy: y(v), r: 2.5 });
        dot.append(svg("title", {}, `${s.name}: ${v} at ${new Date(t).toLocaleString()}`));
        chart.append(dot);
      }
    });
    return figure(caption, chart, series);
  }

  // A 0-100 health score as a small bar.
  function health(score) {
    const chart = svg("svg", { class: "health", width: 60, height: 10, role: "img", "aria-label": `health ${score}` });
    const level = score >= 80 ? "good" : score >= 50 ? "warn" : "bad";
    chart.append(svg("rect", { class: "track", width: 60, height: 10, rx: 2 }));
    chart.append(svg("rect", { class: level, width: (60 * score) / 100, height: 10, rx: 2 }));
    return chart;
  }

  window.Charts = { bars, lines, health };
})();
