// rsigym watch: sorting and filtering, charts (plotly.js from the plotly Python package), live updates (SSE).
(function () {
  "use strict";
  const body = document.body;
  const base = body.dataset.base || "";
  const page = body.dataset.page;
  const $ = (sel, root) => (root || document).querySelector(sel);
  const $$ = (sel, root) => Array.from((root || document).querySelectorAll(sel));

  // ------------------------------------------------------------------ live indicator, relative times
  function live(state) {
    const el = $("#live");
    if (!el) return;
    el.classList.toggle("on", state === "on");
    el.classList.toggle("off", state === "off");
    $("span", el).textContent = state === "on" ? "live" : state === "off" ? "reconnecting" : "connecting";
  }
  function ago(seconds) {
    if (seconds < 2) return "just now";
    if (seconds < 120) return Math.round(seconds) + " s ago";
    if (seconds < 7200) return Math.round(seconds / 60) + " min ago";
    if (seconds < 172800) return (seconds / 3600).toFixed(1) + " h ago";
    return (seconds / 86400).toFixed(1) + " d ago";
  }
  function tick() {
    const now = Date.now() / 1000;
    for (const el of $$("[data-ago]")) {
      const t = parseFloat(el.dataset.ago);
      if (!isNaN(t)) { el.textContent = ago(Math.max(0, now - t)); el.title = new Date(t * 1000).toLocaleString(); }
    }
  }
  setInterval(tick, 1000);

  function stream(url, event, handler) {
    if (!window.EventSource) return;
    const source = new EventSource(url);
    source.addEventListener("open", () => live("on"));
    source.addEventListener("error", () => live("off"));
    source.addEventListener(event, (e) => { live("on"); handler(JSON.parse(e.data)); });
    window.addEventListener("pagehide", () => source.close());
    return source;
  }

  // ------------------------------------------------------------------ sortable, filterable tables
  function cellValue(row, i) {
    const td = row.children[i];
    if (!td) return "";
    const v = td.dataset.v !== undefined ? td.dataset.v : td.textContent.trim();
    const n = parseFloat(v);
    return v !== "" && !isNaN(n) && /^-?[\d.e+-]+$/i.test(v) ? n : v.toLowerCase();
  }
  function sortTable(table) {
    const th = $("th.asc, th.desc", table);
    if (!th) return;
    const i = parseInt(th.dataset.sort, 10), dir = th.classList.contains("asc") ? 1 : -1;
    const tbody = table.tBodies[0];
    const rows = Array.from(tbody.rows);
    rows.sort((a, b) => {
      const x = cellValue(a, i), y = cellValue(b, i);
      if (typeof x === "number" && typeof y === "number") return (x - y) * dir;
      return String(x).localeCompare(String(y)) * dir;
    });
    for (const r of rows) tbody.appendChild(r);
  }
  function sortable(table, onSort) {
    for (const th of $$("th[data-sort]", table)) {
      th.addEventListener("click", () => {
        const dir = th.classList.contains("asc") ? "desc" : "asc";
        for (const other of $$("th", table)) other.classList.remove("asc", "desc");
        th.classList.add(dir);
        sortTable(table);
        if (onSort) onSort();
      });
    }
  }
  function filterRuns() {
    const table = $("#runs"), form = $("#filters");
    if (!table || !form) return;
    const want = { scenario: form.scenario.value, researcher: form.researcher.value, status: form.status.value };
    const q = form.q.value.trim().toLowerCase();
    let shown = 0, total = 0;
    for (const row of table.tBodies[0].rows) {
      total += 1;
      const ok = Object.entries(want).every(([k, v]) => !v || row.dataset[k] === v) &&
        (!q || row.textContent.toLowerCase().includes(q));
      row.hidden = !ok;
      if (ok) shown += 1;
    }
    $("#count").textContent = shown === total ? total + " runs" : shown + " of " + total + " runs";
  }
  function addOptions(row) {
    const form = $("#filters");
    for (const name of ["scenario", "researcher"]) {
      const select = form[name], value = row.dataset[name];
      if (value && !Array.from(select.options).some((o) => o.value === value)) {
        const option = document.createElement("option");
        option.textContent = value;
        select.appendChild(option);
      }
    }
  }
  function fromHTML(html, wrapper) {
    const t = document.createElement(wrapper || "template");
    if (wrapper === "tbody") { const table = document.createElement("table"); table.innerHTML = "<tbody>" + html + "</tbody>"; return Array.from(table.tBodies[0].children); }
    t.innerHTML = html;
    return Array.from(t.content.children);
  }

  function runsPage() {
    const table = $("#runs"), form = $("#filters");
    sortable(table, filterRuns);
    for (const el of $$("select, input", form)) { el.addEventListener("input", filterRuns); el.addEventListener("change", filterRuns); }
    form.addEventListener("submit", (e) => e.preventDefault());
    filterRuns();
    stream(base + "/events?gen=" + encodeURIComponent(table.dataset.gen || "0"), "rows", (data) => {
      const tbody = table.tBodies[0];
      const existing = new Map(Array.from(tbody.rows).map((r) => [r.dataset.key, r]));
      for (const [key, html] of Object.entries(data.rows || {})) {
        const [row] = fromHTML(html, "tbody");
        if (!row) continue;
        const old = existing.get(key);
        if (old) old.replaceWith(row); else tbody.insertBefore(row, tbody.firstChild);
        existing.set(key, row);
        addOptions(row);
      }
      if (data.keys) {
        const keep = new Set(data.keys);
        for (const [key, row] of existing) if (!keep.has(key)) row.remove();
      }
      const empty = $(".empty");
      if (empty && tbody.rows.length) empty.remove();
      table.dataset.gen = data.gen;
      sortTable(table);
      filterRuns();
      tick();
    });
  }

  // ------------------------------------------------------------------ charts
  const config = { displaylogo: false, responsive: true, displayModeBar: false };
  const font = { family: "system-ui, sans-serif", size: 11, color: "#374151" };
  function layout(extra) {
    return Object.assign({ margin: { l: 48, r: 12, t: 26, b: 40 }, font: font, paper_bgcolor: "#fff", plot_bgcolor: "#fff",
      legend: { orientation: "h", x: 0, y: 1.01, yanchor: "bottom", font: { size: 10 } }, hovermode: "closest",
      xaxis: { gridcolor: "#eef0f3", zeroline: false }, yaxis: { gridcolor: "#eef0f3", zeroline: false } }, extra || {});
  }
  function draw(id, traces, lay, emptyText) {
    const div = document.getElementById(id);
    if (!div) return;
    if (!window.Plotly) { div.innerHTML = '<div class="empty-chart">charts need the plotly package</div>'; return; }
    if (!traces.length) {
      if (div.dataset.drawn) { window.Plotly.purge(div); delete div.dataset.drawn; }
      div.innerHTML = '<div class="empty-chart">' + (emptyText || "nothing yet") + "</div>";
      return;
    }
    if (!div.dataset.drawn) { div.innerHTML = ""; div.dataset.drawn = "1"; window.Plotly.newPlot(div, traces, lay, config); }
    else window.Plotly.react(div, traces, lay, config);
  }
  const palette = ["#2563eb", "#db2777", "#059669", "#d97706", "#7c3aed", "#0891b2", "#dc2626", "#65a30d", "#4b5563", "#c026d3"];

  function budgetTraces(x, c) {
    if (!x || !x.length || x.every((v) => v === null)) return [];
    const committed = c.spent.map((s, i) => (s === null ? null : s + (c.reserved[i] || 0)));
    const traces = [
      { x: x, y: c.spent, name: "spent", type: "scatter", mode: "lines+markers", line: { color: "#0f766e", shape: "hv" }, fill: "tozeroy", fillcolor: "rgba(15,118,110,.12)", marker: { size: 4 } },
      { x: x, y: committed, name: "spent + reserved", type: "scatter", mode: "lines", line: { color: "#d97706", dash: "dot", shape: "hv" } },
      { x: x, y: c.left, name: "budget left", type: "scatter", mode: "lines", line: { color: "#2563eb", shape: "hv" } },
    ];
    if (c.budget) traces.push({ x: [x[0], x[x.length - 1]], y: [c.budget, c.budget], name: "budget", type: "scatter", mode: "lines", line: { color: "#9ca3af", dash: "dash", width: 1 } });
    return traces;
  }
  function runCharts(c) {
    draw("chart-budget-steps", budgetTraces(c.steps, c), layout({ xaxis: { title: { text: "step" }, gridcolor: "#eef0f3" }, yaxis: { title: { text: "dollars" }, gridcolor: "#eef0f3", rangemode: "tozero" } }), "no steps yet");
    draw("chart-budget-time", budgetTraces(c.world_h, c), layout({ xaxis: { title: { text: "world time (h)" }, gridcolor: "#eef0f3" }, yaxis: { title: { text: "dollars" }, gridcolor: "#eef0f3", rangemode: "tozero" } }),
      c.steps.length ? "no world time in this record (an older run)" : "no steps yet");
    const devX = c.dev_x === "step" ? c.steps : c.world_h;
    const dev = c.candidates.map((cand, i) => ({ x: cand.x, y: cand.y, text: cand.jobs, name: cand.name, type: "scatter", mode: "lines+markers",
      marker: { size: 8, color: palette[i % palette.length] }, line: { color: palette[i % palette.length] }, hovertemplate: "%{text}: %{y:.3f}<extra>" + cand.name + "</extra>" }));
    if (dev.length && devX) dev.push({ x: devX, y: c.best, name: "best so far", type: "scatter", mode: "lines", line: { color: "#111827", width: 1, dash: "dot", shape: "hv" }, connectgaps: false });
    draw("chart-dev", dev, layout({ xaxis: { title: { text: c.dev_x === "step" ? "step" : "world time (h)" }, gridcolor: "#eef0f3" }, yaxis: { title: { text: "dev score" }, gridcolor: "#eef0f3", range: [0, 1.02] } }), "no dev evaluation yet");
    const loss = c.loss.map((l, i) => ({ x: l.y.map((_, k) => k + 1), y: l.y, name: l.name, type: "scatter", mode: "lines", line: { color: palette[i % palette.length] } }));
    draw("chart-loss", loss, layout({ xaxis: { title: { text: "training step" }, gridcolor: "#eef0f3" }, yaxis: { title: { text: "loss" }, gridcolor: "#eef0f3" } }), "no training job has finished");
    const modes = Object.entries(c.failures.modes).map(([mode, counts], i) => ({ x: c.failures.jobs, y: counts, name: mode, type: "bar", marker: { color: palette[(i + 3) % palette.length] } }));
    draw("chart-failures", modes, layout({ barmode: "stack", xaxis: { title: { text: "evaluation job" }, type: "category" }, yaxis: { title: { text: "failed attempts" }, gridcolor: "#eef0f3" } }), "no failed attempts recorded");
  }

  function runPage() {
    const root = $("#run"), key = root.dataset.key;
    const data = JSON.parse($("#chart-data").textContent);
    runCharts(data);
    root.addEventListener("click", (e) => {
      const button = e.target.closest("button.obs");
      if (!button) return;
      const n = button.dataset.step, row = $('tr.obs-row[data-for="' + n + '"]', root), pre = $("pre", row);
      row.hidden = !row.hidden;
      if (!row.hidden && !pre.dataset.loaded) {
        pre.textContent = "loading…";
        fetch(base + "/runs/" + encodeURIComponent(key) + "/steps/" + n).then((r) => r.text()).then((text) => { pre.textContent = text; pre.dataset.loaded = "1"; })
          .catch((err) => { pre.textContent = "could not load: " + err; });
      }
    });
    root.addEventListener("submit", (e) => {
      const form = e.target.closest("#compare");
      if (!form) return;
      e.preventDefault();
      const url = base + "/runs/" + encodeURIComponent(key) + "/diff?a=" + encodeURIComponent(form.a.value) + "&b=" + encodeURIComponent(form.b.value);
      fetch(url).then((r) => r.text()).then((html) => { $("#compare-out").innerHTML = html; });
    });
    stream(base + "/runs/" + encodeURIComponent(key) + "/events?after=" + root.dataset.after, "run", (parts) => {
      const tbody = $("#steps-body");
      for (const row of fromHTML(parts.rows, "tbody")) tbody.appendChild(row);
      for (const [name, html] of Object.entries(parts.sections)) {
        const el = document.getElementById("sec-" + name);
        if (!el) continue;
        const open = new Set($$("details[open] summary", el).map((s) => s.textContent));
        el.innerHTML = html;
        for (const d of $$("details", el)) if (open.has($("summary", d).textContent)) d.open = true;
      }
      root.dataset.after = parts.after;
      $("#step-count").textContent = parts.after + " steps";
      runCharts(parts.charts);
      tick();
    });
  }

  function sweepPage() {
    const data = JSON.parse($("#chart-data").textContent);
    const h = data.heatmap;
    draw("chart-heatmap", [{ type: "heatmap", z: h.z, x: h.x, y: h.y, text: h.text, texttemplate: "%{text}", hovertemplate: "%{y} on %{x}: %{text}<extra></extra>",
      colorscale: [[0, "#d73027"], [0.25, "#fc8d59"], [0.5, "#ffffbf"], [0.75, "#91cf60"], [1, "#1a9850"]], zmid: 0, colorbar: { title: { text: "gain" }, thickness: 12 } }], layout({ margin: { l: 90, r: 10, t: 8, b: 40 }, yaxis: { autorange: "reversed" } }), "no episodes");
    data.anytime.forEach((panel, p) => {
      const traces = panel.traces.map((t, i) => ({ x: t.x, y: t.y, name: t.agent + " (n=" + t.n + ")", type: "scatter", mode: "lines", line: { color: palette[i % palette.length], shape: "hv" } }));
      const shapes = panel.initial === null ? [] : [{ type: "line", xref: "paper", x0: 0, x1: 1, y0: panel.initial, y1: panel.initial, line: { color: "#9ca3af", dash: "dot", width: 1 } }];
      draw("chart-anytime-" + p, traces, layout({ shapes: shapes, xaxis: { title: { text: "dollars spent" }, gridcolor: "#eef0f3" }, yaxis: { title: { text: "best dev score so far" }, gridcolor: "#eef0f3" } }), "no successful episode");
    });
    const table = $("#episodes");
    if (table) sortable(table);
  }

  function episodePage() {
    const data = JSON.parse($("#chart-data").textContent);
    const curve = data.curve || [];
    const trace = { x: curve.map((p) => p[0]), y: curve.map((p) => (p[1] < 0 ? null : p[1])), name: "best dev score so far", type: "scatter", mode: "lines+markers", line: { color: "#2563eb", shape: "hv" }, marker: { size: 5 } };
    const shapes = data.initial === null ? [] : [{ type: "line", xref: "paper", x0: 0, x1: 1, y0: data.initial, y1: data.initial, line: { color: "#9ca3af", dash: "dot", width: 1 } }];
    draw("chart-episode", curve.length ? [trace] : [], layout({ shapes: shapes, xaxis: { title: { text: "dollars spent" }, gridcolor: "#eef0f3" }, yaxis: { title: { text: "best dev score" }, gridcolor: "#eef0f3" } }), "no steps recorded");
  }

  function start() {
    tick();
    if (page === "runs") runsPage();
    else if (page === "run") runPage();
    else {
      const el = $("#live");
      if (el) el.hidden = true;
      if (page === "sweep") sweepPage();
      else if (page === "episode") episodePage();
    }
  }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start); else start();
})();
