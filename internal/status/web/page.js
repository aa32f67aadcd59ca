// The loadshed status page: reads status/data.json about once a second and draws it. Every figure's
// element carries data-metric (and data-route, data-door, data-reason or data-scope="all") and,
// once drawn, data-value with the number as the JSON has it, so a test can read it.
"use strict";

(function () {
  const SVG = "http://www.w3.org/2000/svg";
  const PERIOD_MS = 1000;

  function fmtNumber(v) {
    if (v === null || v === undefined) return "–";
    if (Math.abs(v) >= 1000) return Math.round(v).toLocaleString("en-US");
    if (Number.isInteger(v)) return String(v);
    return v.toFixed(Math.abs(v) >= 10 ? 1 : 2);
  }

  function fmtSeconds(v) {
    if (v === null || v === undefined) return "–";
    if (v < 1) return (v * 1000).toFixed(v < 0.01 ? 2 : 1) + " ms";
    return v.toFixed(2) + " s";
  }

  // set writes a figure: its text, and its raw value in data-value.
  function set(el, v, fmt) {
    if (!el) return;
    el.dataset.value = v === null || v === undefined ? "" : String(v);
    el.textContent = (fmt || fmtNumber)(v);
  }

  function all(metric) {
    return document.querySelector('[data-scope="all"][data-metric="' + metric + '"]');
  }

  function cell(tr, metric, v, fmt, attrs) {
    const td = document.createElement("td");
    td.dataset.metric = metric;
    for (const k in attrs) td.dataset[k] = attrs[k];
    if (typeof v === "string") {
      td.dataset.value = v;
      td.textContent = v || "–";
    } else {
      set(td, v, fmt);
    }
    tr.appendChild(td);
    return td;
  }

  function rows(tbody, items, fill) {
    const next = document.createDocumentFragment();
    for (const it of items) {
      const tr = document.createElement("tr");
      fill(tr, it);
      next.appendChild(tr);
    }
    tbody.replaceChildren(next);
  }

  function countsCells(tr, c, attrs, withLatency) {
    cell(tr, "admitted_per_second", c.admittedPerSecond, null, attrs);
    cell(tr, "refused_per_second", c.refusedPerSecond, null, attrs);
    cell(tr, "upstream_errors_per_second", c.upstreamErrorsPerSecond, null, attrs);
    if (withLatency) {
      cell(tr, "admitted_p50_seconds", c.p50Seconds, fmtSeconds, attrs);
      cell(tr, "admitted_p99_seconds", c.p99Seconds, fmtSeconds, attrs);
    }
    cell(tr, "admitted_total", c.admittedTotal, null, attrs);
    cell(tr, "refused_total", c.refusedTotal, null, attrs);
    cell(tr, "upstream_errors_total", c.upstreamErrorsTotal, null, attrs);
  }

  function draw(v) {
    const t = v.totals;
    all("strategy").textContent = v.strategy || "–";
    all("strategy").dataset.value = v.strategy || "";
    const dr = all("draining");
    dr.dataset.value = v.draining ? "1" : "0";
    dr.textContent = v.draining ? "draining" : "serving";
    dr.classList.toggle("draining", !!v.draining);
    set(all("limit"), t.limit);
    set(all("inflight"), t.inflight);
    set(all("queued"), t.queued);
    set(all("admitted_per_second"), t.admittedPerSecond);
    set(all("refused_per_second"), t.refusedPerSecond);
    set(all("upstream_errors_per_second"), t.upstreamErrorsPerSecond);
    set(all("admitted_total"), t.admittedTotal);
    set(all("refused_total"), t.refusedTotal);
    set(all("upstream_errors_total"), t.upstreamErrorsTotal);
    set(all("admitted_p50_seconds"), t.p50Seconds, fmtSeconds);
    set(all("admitted_p99_seconds"), t.p99Seconds, fmtSeconds);
    set(all("interval_seconds"), v.intervalSeconds);
    set(all("window_seconds"), v.windowSeconds);
    set(all("samples"), v.samples);
    set(all("sample_time"), v.time, function (ms) { return new Date(ms).toISOString(); });

    rows(document.getElementById("reasons"), v.reasons, function (tr, r) {
      const a = { reason: r.reason };
      cell(tr, "reason", r.reason, null, a);
      cell(tr, "refused_per_second", r.perSecond, null, a);
      cell(tr, "refused_total", r.total, null, a);
      if (!r.total) tr.className = "quiet";
    });
    rows(document.getElementById("routes"), v.routes, function (tr, r) {
      const a = { route: r.route };
      cell(tr, "route", r.route, null, a);
      cell(tr, "strategy", r.strategy, null, a);
      cell(tr, "limit", r.limit, null, a);
      cell(tr, "inflight", r.inflight, null, a);
      cell(tr, "queued", r.queued, null, a);
      countsCells(tr, r, a, true);
    });
    rows(document.getElementById("doors"), v.doors, function (tr, d) {
      const a = { door: d.door };
      cell(tr, "door", d.door, null, a);
      countsCells(tr, d, a, false);
    });

    const h = v.history;
    chart(document.getElementById("chart-rates"), h.t, [
      ["admitted_per_second", "admitted", h.admittedPerSecond],
      ["refused_per_second", "refused", h.refusedPerSecond],
      ["upstream_errors_per_second", "errors", h.upstreamErrorsPerSecond],
    ], fmtNumber);
    chart(document.getElementById("chart-state"), h.t, [
      ["limit", "limit", h.limit],
      ["inflight", "inflight", h.inflight],
      ["queued", "queued", h.queued],
    ], fmtNumber);
    chart(document.getElementById("chart-latency"), h.t, [
      ["admitted_p50_seconds", "p50", h.p50Seconds],
      ["admitted_p99_seconds", "p99", h.p99Seconds],
    ], fmtSeconds);
  }

  function el(name, attrs, text) {
    const e = document.createElementNS(SVG, name);
    for (const k in attrs) e.setAttribute(k, attrs[k]);
    if (text !== undefined) e.textContent = text;
    return e;
  }

  // chart draws series over the last five minutes (t: seconds before the latest sample) into
  // svg, with a y axis from 0 to a round maximum.
  function chart(svg, t, series, fmt) {
    const W = 420, H = 170, left = 58, right = 14, top = 8, bottom = 20, span = 300;
    let top_ = 0;
    for (const s of series) for (const y of s[2] || []) if (y !== null && y > top_) top_ = y;
    top_ = niceCeil(top_);
    const x = function (s) { return left + (W - left - right) * (1 + Math.max(s, -span) / span); };
    const y = function (v) { return top + (H - top - bottom) * (1 - v / top_); };
    const g = document.createDocumentFragment();
    for (let i = 0; i <= 4; i++) {
      const v = top_ * i / 4;
      g.appendChild(el("line", { class: "grid", x1: left, x2: W - right, y1: y(v), y2: y(v) }));
      g.appendChild(el("text", { class: "tick", x: left - 6, y: y(v) + 4, "text-anchor": "end" }, fmt(v)));
    }
    for (let s = -span; s <= 0; s += 60) {
      g.appendChild(el("text", { class: "tick", x: x(s), y: H - 5, "text-anchor": s === 0 ? "end" : "middle" }, s === 0 ? "now" : (s / 60) + " min"));
    }
    for (const s of series) {
      let d = "", pen = "M", n = 0;
      const ys = s[2] || [];
      for (let i = 0; i < ys.length; i++) {
        if (ys[i] === null || t[i] < -span) { pen = "M"; continue; }
        d += pen + x(t[i]).toFixed(1) + " " + y(ys[i]).toFixed(1) + " ";
        pen = "L";
        n++;
      }
      g.appendChild(el("path", { class: "line " + s[1], d: d.trim() || "M0 0", "data-series": s[0], "data-points": n }));
    }
    svg.replaceChildren(g);
  }

  function niceCeil(v) {
    if (!(v > 0)) return 1;
    const p = Math.pow(10, Math.floor(Math.log10(v)));
    for (const m of [1, 2, 2.5, 5, 10]) if (v <= m * p) return m * p;
    return 10 * p;
  }

  let last = 0;
  function age() {
    const a = document.getElementById("age");
    if (!last) return;
    const s = Math.max(0, Math.round((Date.now() - last) / 1000));
    a.textContent = s <= 2 ? "live" : "last sample " + s + " s ago";
    a.classList.toggle("stale", s > 2);
  }

  async function poll() {
    try {
      const res = await fetch("status/data.json", { cache: "no-store" });
      if (res.ok) {
        const v = await res.json();
        if (v.samples > 0) {
          draw(v);
          last = Date.now();
        }
      }
    } catch (e) {
      // The sidecar is away (restarting, draining): the figures stay, marked stale.
    }
    age();
    setTimeout(poll, PERIOD_MS);
  }
  poll();
})();
