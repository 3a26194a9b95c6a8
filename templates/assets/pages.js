// Every page: times in the reader's own time zone, with the UTC offset shown.
// A <time datetime="...Z" data-local> element gets its text rewritten; its title keeps
// the server's version (the campus time).
(function () {
  function pad(n) { return (n < 10 ? '0' : '') + n; }
  function local(d) {
    const off = -d.getTimezoneOffset();
    const sign = off < 0 ? '-' : '+';
    const a = Math.abs(off);
    const zone = off === 0 ? 'UTC' : 'UTC' + sign + pad(Math.floor(a / 60)) + ':' + pad(a % 60);
    return d.getFullYear() + '-' + pad(d.getMonth() + 1) + '-' + pad(d.getDate()) + ' ' +
      pad(d.getHours()) + ':' + pad(d.getMinutes()) + ' ' + zone;
  }
  function localise(root) {
    root.querySelectorAll('time[data-local]').forEach(function (t) {
      const d = new Date(t.getAttribute('datetime'));
      if (isNaN(d.getTime())) return;
      if (!t.title) t.title = t.textContent;
      t.textContent = local(d);
    });
  }
  window.commonsLocalise = localise;
  document.addEventListener('DOMContentLoaded', function () { localise(document); });
})();
