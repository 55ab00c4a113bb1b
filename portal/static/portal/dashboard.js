// Live dashboard client: renders snapshots (first the one embedded in the page, then each one
// pushed over the WebSocket) as tables and small inline-SVG charts. No dependencies.
(function () {
  "use strict";
  const script = document.currentScript;
  const wsPath = script.dataset.wsPath;
  const SVG = "http://www.w3.org/2000/svg";

  function $(id) { return document.getElementById(id); }

  function cell(text, cls) {
    const td = document.createElement("td");
    td.textContent = text === null || text === undefined ? "—" : String(text);
    if (cls) td.className = cls;
    return td;
  }

  function loadBar(used, total) {
    const td = document.createElement("td");
    td.className = "chart";
    const svg = document.createElementNS(SVG, "svg");
    svg.setAttribute("class", "bar bar-small");
    svg.setAttribute("viewBox", "0 0 100 10");
    svg.setAttribute("preserveAspectRatio", "none");
    const bg = document.createElementNS(SVG, "rect");
    bg.setAttribute("class", "seg-empty");
    bg.setAttribute("width", "100");
    bg.setAttribute("height", "10");
    const fg = document.createElementNS(SVG, "rect");
    fg.setAttribute("class", "seg-held");
    fg.setAttribute("width", total ? String((100 * used) / total) : "0");
    fg.setAttribute("height", "10");
    svg.append(bg, fg);
    td.append(svg);
    return td;
  }

  function fillRows(tbody, rows, build, emptyText, columns) {
    const body = $(tbody);
    body.replaceChildren();
    if (!rows.length) {
      const tr = document.createElement("tr");
      const td = cell(emptyText, "muted");
      td.colSpan = columns;
      tr.append(td);
      body.append(tr);
      return;
    }
    for (const row of rows) {
      const tr = document.createElement("tr");
      tr.append(...build(row));
      body.append(tr);
    }
  }

  // "45 s", "12 min", "3 h 05 min", "2 d 4 h": a wait at a glance.
  function duration(seconds) {
    if (seconds < 60) return seconds + " s";
    const m = Math.floor(seconds / 60), h = Math.floor(m / 60), d = Math.floor(h / 24);
    if (h < 1) return m + " min";
    if (d < 1) return h + " h " + String(m % 60).padStart(2, "0") + " min";
    return d + " d " + (h % 24) + " h";
  }

  function pct(value) { return value === null || value === undefined ? null : value.toFixed(0) + " %"; }

  // Bars for a series of numbers (credits per 5 minutes); heights relative to the largest.
  function drawBars(svg, series) {
    svg.replaceChildren();
    const max = Math.max(1, ...series);
    const w = 240 / Math.max(series.length, 1);
    series.forEach(function (v, i) {
      const h = v > 0 ? Math.max(2, (58 * v) / max) : 0;
      const r = document.createElementNS(SVG, "rect");
      r.setAttribute("x", String(i * w + 1));
      r.setAttribute("y", String(60 - h));
      r.setAttribute("width", String(w - 2));
      r.setAttribute("height", String(h));
      r.setAttribute("class", "seg-spent");
      svg.append(r);
    });
  }

  // A sparkline (polyline + area) of the recent history of one number.
  function drawSpark(svg, points, top) {
    svg.replaceChildren();
    if (points.length < 1) return;
    const max = Math.max(1, top);
    // Spread the points over the full width (they get denser as history fills up).
    const series = points.length === 1 ? [points[0], points[0]] : points;
    const step = 240 / (series.length - 1);
    const coords = series.map(function (v, i) {
      return (i * step).toFixed(1) + "," + (58 - (56 * v) / max).toFixed(1);
    });
    const area = document.createElementNS(SVG, "polygon");
    area.setAttribute("points", "0,60 " + coords.join(" ") + " 240,60");
    area.setAttribute("class", "spark-area");
    const line = document.createElementNS(SVG, "polyline");
    line.setAttribute("points", coords.join(" "));
    line.setAttribute("class", "spark-line");
    svg.append(area, line);
  }

  function render(snap) {
    // UTC, labelled, as every time on the portal's pages (QA: the browser's zone, unlabelled).
    $("generated-at").textContent = new Date(snap.generated_at).toISOString().slice(11, 19) + " UTC";
    $("generated-at").setAttribute("datetime", snap.generated_at);

    // Money arrives formatted by the server (the one money helper); only the chart scales ints.
    const consumption = snap.consumption;
    const series = consumption.length ? consumption[0].series.map(function () { return 0; }) : [];
    consumption.forEach(function (row) { row.series.forEach(function (v, i) { series[i] += v; }); });
    $("consumed-total").textContent = snap.consumed_total_display || "0.00";
    drawBars($("consumption-chart"), series.length ? series : [0]);
    fillRows("consumption-rows", consumption, function (row) {
      return [cell(row.org), cell(row.display, "num")];
    }, "No credits consumed in the last hour.", 2);

    let gpus = 0, allocated = 0;
    snap.gpu_types.forEach(function (t) { gpus += t.gpus; allocated += t.allocated; });
    $("gpus-allocated").textContent = allocated;
    $("gpus-total").textContent = gpus;
    drawSpark($("allocation-spark"), snap.gpus_in_use_last_hour, gpus);
    fillRows("gpu-type-rows", snap.gpu_types, function (t) {
      return [cell(t.name), cell(t.allocated + " / " + t.gpus, "num"), loadBar(t.allocated, t.gpus), cell(pct(t.utilization), "num")];
    }, "No GPUs registered.", 4);
    fillRows("node-rows", snap.nodes, function (n) {
      return [cell(n.name), cell(n.gpu_type), cell(n.state, "state state-" + n.state), cell(n.allocated + " / " + n.gpus, "num"), loadBar(n.allocated, n.gpus), cell(pct(n.utilization), "num")];
    }, "No nodes registered.", 6);

    let queued = 0;
    snap.queue.forEach(function (q) { queued += q.jobs; });
    $("queue-count").textContent = "(" + queued + ")";
    fillRows("queue-rows", snap.queue, function (q) {
      return [cell(q.reason, "code"), cell(q.jobs, "num"), cell(q.gpus, "num"), cell(duration(q.longest_wait_seconds), "num")];
    }, "No jobs waiting.", 4);

    $("running-count").textContent = "(" + snap.running_jobs.length + ")";
    fillRows("job-rows", snap.running_jobs, function (j) {
      return [cell("#" + j.id + " " + j.name), cell(j.org + "/" + j.project), cell(j.user), cell(j.gpu_count + "× " + j.gpu_type), cell(j.state, "state state-" + j.state), cell(j.gpu_hours.toFixed(2), "num"), cell(pct(j.utilization), "num")];
    }, "No jobs running.", 7);
  }

  function status(state, text) {
    const el = $("live-status");
    el.dataset.state = state;
    el.textContent = text;
  }

  let retry = 1000;
  let socket = null;
  function connect() {
    const scheme = location.protocol === "https:" ? "wss://" : "ws://";
    socket = new WebSocket(scheme + location.host + wsPath);
    socket.onopen = function () { retry = 1000; status("live", "live"); };
    socket.onmessage = function (event) {
      const message = JSON.parse(event.data);
      if (message.type === "snapshot") {
        render(message.snapshot);
        document.body.dataset.updates = String(Number(document.body.dataset.updates || "0") + 1);
      }
    };
    socket.onclose = function (event) {
      // Signed out, or the session changed (a password change cycles its key): the page reloads,
      // and the server shows the dashboard again or the sign-in page (review).
      if (event.code === 4401) { status("closed", "signed out"); location.reload(); return; }
      if (event.code === 4403) { status("closed", "not allowed"); return; }
      status("reconnecting", "reconnecting…");
      setTimeout(connect, retry);
      retry = Math.min(retry * 2, 30000);
    };
  }
  // A tab coming back to the foreground asks for a fresh snapshot instead of waiting for the next.
  document.addEventListener("visibilitychange", function () {
    if (!document.hidden && socket && socket.readyState === WebSocket.OPEN) {
      socket.send(JSON.stringify({ type: "refresh" }));
    }
  });

  render(JSON.parse($("dashboard-initial").textContent));
  connect();
})();
