// The job page, live: every two seconds while the job is not finished, the status part
// (state, history, output) is fetched again and swapped in, keeping what the reader
// had open or focused. "Follow the log" keeps the output scrolled to its end. The GPU
// utilisation chart is fetched again when the job's state changes and every sample
// interval (its section's data-refresh-ms) while the job runs.
(function () {
  const box = document.getElementById('status');
  if (!box) return;
  const follow = document.getElementById('log-follow');
  const chart = document.getElementById('utilization');
  const chartEvery = chart ? Number(chart.dataset.refreshMs) || 60000 : 0;
  let chartAt = Date.now();
  let shownState = state();
  function logs() { return document.getElementById('logs'); }
  function toEnd() { const l = logs(); if (l) l.scrollTop = l.scrollHeight; }
  function state() { const s = document.getElementById('job-state'); return s ? s.textContent : ''; }
  async function refreshChart() {
    chartAt = Date.now();
    try {
      const r = await fetch('/jobs/' + box.dataset.job + '/utilization', { credentials: 'same-origin' });
      if (r.ok) chart.innerHTML = await r.text();
    } catch (e) { /* try again later */ }
  }
  async function refresh() {
    if (box.querySelector('[data-active="false"]')) return;
    try {
      const r = await fetch('/jobs/' + box.dataset.job + '/status', { credentials: 'same-origin' });
      if (r.ok) {
        const open = Array.from(box.querySelectorAll('details[open]')).map(function (d) { return d.id; });
        const a = document.activeElement;
        const focused = a && box.contains(a) ? a.id : '';
        box.innerHTML = await r.text();
        open.forEach(function (id) { const d = document.getElementById(id); if (d) d.open = true; });
        if (focused) { const f = document.getElementById(focused); if (f) f.focus(); }
        if (window.commonsLocalise) window.commonsLocalise(box);
        if (follow && follow.checked) toEnd();
        const now = state();
        if (chart && (now !== shownState || Date.now() - chartAt >= chartEvery)) {
          shownState = now;
          await refreshChart();
        }
      }
    } catch (e) { /* try again on the next tick */ }
    setTimeout(refresh, 2000);
  }
  const jump = document.getElementById('log-jump');
  if (jump) jump.addEventListener('click', function () {
    toEnd();
    const l = logs();
    if (l) { l.scrollIntoView({ block: 'end' }); l.focus(); }
  });
  if (follow && follow.checked) toEnd();
  setTimeout(refresh, 2000);
})();
