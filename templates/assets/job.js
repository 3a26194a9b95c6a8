// Refresh the status part every two seconds while the job is not finished.
(function () {
  const box = document.getElementById('status');
  async function refresh() {
    if (box.querySelector('[data-active="false"]')) return;
    try {
      const r = await fetch('/jobs/' + box.dataset.job + '/status', { credentials: 'same-origin' });
      if (r.ok) box.innerHTML = await r.text();
    } catch (e) { /* try again on the next tick */ }
    setTimeout(refresh, 2000);
  }
  setTimeout(refresh, 2000);
})();
