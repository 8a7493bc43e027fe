// The dashboard's pages, rendered from the daemon's JSON API (/api/v1/...). Read-only.
"use strict";

(function () {
  const main = document.getElementById("main");

  // Snapshot ids exceed JavaScript's exact integers: keep such numbers as their digits.
  function parse(text) {
    return JSON.parse(text, (key, value, context) =>
      typeof value === "number" && !Number.isSafeInteger(value) && context && /^-?\d+$/.test(context.source)
        ? context.source
        : value);
  }

  async function get(path) {
    const response = await fetch(path, { headers: { Accept: "application/json" } });
    const body = parse(await response.text());
    if (!response.ok) throw new Error(body.error || `${path}: HTTP ${response.status}`);
    return body;
  }

  function el(tag, attributes, ...children) {
    const node = document.createElement(tag);
    for (const [name, value] of Object.entries(attributes || {})) {
      if (value !== null && value !== undefined) node.setAttribute(name, String(value));
    }
    for (const child of children.flat()) {
      if (child === null || child === undefined) continue;
      node.append(child instanceof Node ? child : String(child));
    }
    return node;
  }

  const UNITS = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
  function bytes(n) {
    if (n === null || n === undefined) return "–";
    let value = Math.abs(n), unit = 0;
    while (value >= 1024 && unit < UNITS.length - 1) { value /= 1024; unit++; }
    return `${n < 0 ? "-" : ""}${value.toFixed(unit && value < 10 ? 1 : 0)} ${UNITS[unit]}`;
  }
  const count = (n) => (n === null || n === undefined ? "–" : Number(n).toLocaleString("en"));
  const when = (ms) => (ms === null || ms === undefined ? "–" : new Date(ms).toLocaleString());
  function duration(ms) {
    if (ms === null || ms === undefined) return "running";
    if (ms < 1000) return `${ms} ms`;
    const s = ms / 1000;
    return s < 120 ? `${s.toFixed(1)} s` : `${(s / 60).toFixed(1)} min`;
  }
  const outcome = (o) => el("span", { class: `outcome-${o || "running"}` }, o || "running");
  const tableLink = (name) => el("a", { href: `/tables/${encodeURIComponent(name)}` }, name);
  const num = (value) => el("td", { class: "num" }, value);

  function grid(headers, rows) {
    const head = el("tr", {}, headers.map((h) =>
      el("th", { class: h.endsWith("#") ? "num" : null }, h.replace(/#$/, ""))));
    return el("table", { class: "grid" }, el("thead", {}, head), el("tbody", {}, rows));
  }

  function cards(items) {
    return el("div", { class: "cards" }, items.map(([label, value]) =>
      el("div", { class: "card" }, el("div", { class: "value" }, value), el("div", { class: "label" }, label))));
  }

  function deletesByKind(row) {
    const kinds = row.delete_files_by_kind;
    if (!kinds) return count(row.delete_files);
    return `${count(row.delete_files)} (pos ${kinds.position}, eq ${kinds.equality}, dv ${kinds.deletion_vector})`;
  }

  function runRows(runs, withTable) {
    return runs.map((r) => el("tr", {},
      el("td", {}, when(r.started_at_ms)),
      withTable ? el("td", {}, tableLink(r.table)) : null,
      el("td", {}, r.action),
      el("td", {}, outcome(r.outcome)),
      num(`${count(r.input_files)} → ${count(r.output_files)}`),
      num(`${bytes(r.input_bytes)} → ${bytes(r.output_bytes)}`),
      num(duration(r.duration_ms)),
      el("td", { class: "mono" }, r.snapshot_ids.join(", ") || "–"),
      el("td", { class: "error" }, r.error || ""),
    ));
  }
  const RUN_HEADERS = ["started", "action", "outcome", "files in → out#", "bytes in → out#", "duration#", "snapshots", "error"];

  // --- pages ----------------------------------------------------------------------------------

  async function overview() {
    const data = await get("/api/v1/tables");
    const parts = [el("h1", {}, "Tables")];
    if (data.failing_jobs.length) {
      parts.push(el("div", { class: "failing", id: "failing-jobs" },
        el("strong", { class: "error" }, "Failing jobs"),
        el("ul", {}, data.failing_jobs.map((j) => el("li", {},
          `${j.job} ${j.action}: ${j.consecutive_failures} ticks failed in a row — `,
          el("span", { class: "error" }, j.last_error || ""))))));
    }
    for (const [window, totals] of Object.entries(data.totals)) {
      parts.push(el("h2", {}, `Last ${window}`), cards([
        ["runs", count(totals.runs)],
        ["files saved", count(totals.files_saved)],
        ["bytes rewritten", bytes(totals.bytes_rewritten)],
        ["files deleted", count(totals.files_deleted)],
        ["bytes deleted", bytes(totals.bytes_deleted)],
      ]));
    }
    parts.push(el("h2", {}, "By need"));
    if (!data.tables.length) {
      parts.push(el("p", { class: "muted" }, "No table scored yet: the jobs' first ticks are still running."));
    } else {
      parts.push(grid(
        ["table", "health", "data files#", "small files#", "delete files#", "manifests#", "bytes#", "avg file#", "last run", "next"],
        data.tables.map((t) => el("tr", { "data-table": t.table },
          el("td", {}, tableLink(t.table), t.error ? el("div", { class: "error" }, t.error) : null),
          el("td", {}, Charts.health(t.health_score), ` ${t.health_score}`),
          num(count(t.data_files)),
          num(count(t.small_files)),
          num(deletesByKind(t)),
          num(count(t.manifests)),
          num(bytes(t.data_bytes)),
          num(bytes(t.average_file_size)),
          el("td", {}, t.last_run
            ? [when(t.last_run.ended_at_ms || t.last_run.started_at_ms), " ", t.last_run.action, " ", outcome(t.last_run.outcome)]
            : "–"),
          el("td", {}, t.next_action ? `${t.next_action.action} ${when(t.next_action.at_ms)}` : "–"),
        )),
      ));
    }
    return parts;
  }

  async function tablePage(name) {
    const t = await get(`/api/v1/tables/${encodeURIComponent(name)}`);
    const parts = [el("h1", {}, t.table), t.error ? el("p", { class: "error" }, t.error) : null];
    parts.push(cards([
      ["health", t.health_score],
      ["data files", count(t.data_files)],
      ["small files", count(t.small_files)],
      ["delete files", deletesByKind(t)],
      ["manifests", count(t.manifests)],
      ["bytes", bytes(t.data_bytes)],
      ["average file", bytes(t.average_file_size)],
      ["target file size", bytes(t.target_file_size)],
    ]));
    if (t.reasons.length) parts.push(el("p", {}, "Due: ", t.reasons.join("; ")));

    const charts = el("div", { class: "charts" });
    const sizes = t.sizes;
    const series = [];
    if (sizes.before) series.push({ name: "before the last compaction", values: sizes.before.counts });
    if (sizes.after) series.push({ name: "after it", values: sizes.after.counts });
    if (sizes.current) series.push({ name: "now", values: sizes.current.counts });
    if (series.length) {
      const labels = t.size_buckets.map(bytes).concat(["larger"]);
      charts.append(Charts.bars("Data files by size", labels, series));
    }
    const history = t.deletes_over_time;
    if (history.length) {
      charts.append(Charts.lines("Deletes over time (live counts after each snapshot)", history.map((s) => s.at_ms), [
        { name: "delete files", values: history.map((s) => s.delete_files) },
        { name: "position-deleted rows", values: history.map((s) => s.position_deletes) },
        { name: "equality-deleted rows", values: history.map((s) => s.equality_deletes) },
      ]));
    }
    parts.push(el("h2", {}, "Charts"), charts);
    if (sizes.note) parts.push(el("p", { class: "muted", id: "sizes-note" }, sizes.note));

    parts.push(el("h2", {}, "Partitions with the most small files"));
    parts.push(t.worst_partitions.length
      ? grid(["partition", "data files#", "under target#", "small files#", "small bytes#"],
        t.worst_partitions.map((p) => el("tr", {},
          el("td", { class: "mono" }, p.partition), num(count(p.data_files)),
          num(count(p.files_under_target)), num(count(p.small_files)), num(bytes(p.small_bytes)))))
      : el("p", { class: "muted" }, "No partition read."));

    parts.push(el("h2", {}, "Runs and maintenance"));
    parts.push(t.runs.length
      ? grid(RUN_HEADERS, runRows(t.runs, false))
      : el("p", { class: "muted" }, "No run yet."));
    return parts;
  }

  async function runsPage() {
    const data = await get("/api/v1/runs?limit=200");
    const headers = RUN_HEADERS.slice(0, 1).concat(["table"], RUN_HEADERS.slice(1));
    return [el("h1", {}, "Recent runs"), data.runs.length
      ? grid(headers, runRows(data.runs, true))
      : el("p", { class: "muted" }, "No run yet.")];
  }

  async function jobsPage() {
    const data = await get("/api/v1/jobs");
    const parts = [el("h1", {}, "Jobs and schedules")];
    for (const job of data.jobs) {
      parts.push(el("h2", {}, job.job, el("span", { class: "muted" }, ` — ${job.file}, catalog ${job.catalog || "(default)"}`)));
      parts.push(el("p", {}, "Tables: ", el("span", { class: "mono" }, job.tables.join(", "))));
      parts.push(grid(["action", "schedule", "next tick", "last tick", "outcome", "failures in a row#", "last error"],
        job.actions.map((a) => el("tr", {},
          el("td", {}, a.action), el("td", {}, a.schedule), el("td", {}, when(a.next_run_at_ms)),
          el("td", {}, when(a.last_tick_at_ms)), el("td", {}, a.last_outcome ? outcome(a.last_outcome) : "–"),
          num(a.consecutive_failures), el("td", { class: "error" }, a.last_error || "")))));
    }
    return parts;
  }

  async function render() {
    const path = location.pathname;
    const table = path.match(/^\/tables\/([^/]+)$/);
    const page = table ? "tables" : path === "/" ? "tables" : path.slice(1);
    for (const link of document.querySelectorAll("nav a")) {
      link.classList.toggle("current", link.dataset.page === page);
    }
    let parts;
    try {
      if (table) parts = await tablePage(decodeURIComponent(table[1]));
      else if (path === "/runs") parts = await runsPage();
      else if (path === "/jobs") parts = await jobsPage();
      else parts = await overview();
      document.title = `compactor — ${table ? decodeURIComponent(table[1]) : page}`;
    } catch (error) {
      parts = [el("p", { class: "error", id: "load-error" }, error.message)];
    }
    main.replaceChildren(...parts.filter((p) => p !== null));
    main.dataset.loaded = "true";
  }

  render();
})();
