"""Report: the scorecard (``scorecard``: published vs reproduced values), the HTML report
(``html``, with its Jinja template under ``templates/``) and a headless browser check of
the page (``browser``)."""
