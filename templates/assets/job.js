// The job page, live: every two seconds while the job is not finished, the status part
// (state, history, output) is fetched again and swapped in, keeping what the reader
// had open or focused. "Follow the log" keeps the output scrolled to its end.
(function () {
  const box = document.getElementById('status');
  if (!box) return;
  const follow = document.getElementById('log-follow');
  function logs() { return document.getElementById('logs'); }
  function toEnd() { const l = logs(); if (l) l.scrollTop = l.scrollHeight; }
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
