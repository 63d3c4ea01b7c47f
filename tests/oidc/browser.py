#!/usr/bin/env python3
"""The browser step of an SSO login, for the tests: opens URL, follows redirects with a cookie
jar, signs in at oidc-provider's login form as LOGIN, grants consent, and follows the redirects
back through the proxy's callback to `sally login`'s listener on 127.0.0.1. Prints the final
page's status and body, and every URL it visits on stderr (`visit URL`). Standard library only.

usage: browser.py URL LOGIN
Environment: STOP_AT=PATH stops before visiting a URL whose path starts with PATH and prints
`stop URL` (for a test to go on from there); COOKIES=1 prints `cookie NAME=VALUE` on stderr
for every cookie the jar holds at the end.
The proxy's certificate is from the cluster's own CA, which this throwaway browser does not
verify (the tests check the cluster's TLS elsewhere).
"""
import http.cookiejar, os, re, ssl, sys, urllib.error, urllib.parse, urllib.request


class NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None


def main():
    url, login = sys.argv[1], sys.argv[2]
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    jar = http.cookiejar.CookieJar()
    opener = urllib.request.build_opener(
        urllib.request.HTTPCookieProcessor(jar),
        urllib.request.HTTPSHandler(context=ctx),
        NoRedirect,
    )
    data = None
    stop_at = os.environ.get("STOP_AT")

    def cookies():
        if os.environ.get("COOKIES"):
            for c in jar:
                print(f"cookie {c.name}={c.value}", file=sys.stderr)

    for _ in range(30):
        if stop_at and urllib.parse.urlsplit(url).path.startswith(stop_at):
            print(f"stop {url}")
            cookies()
            sys.exit(0)
        print(f"visit {url}", file=sys.stderr)
        req = urllib.request.Request(url, data=data)
        try:
            resp = opener.open(req, timeout=20)
            status, headers, body = resp.status, resp.headers, resp.read().decode(errors="replace")
        except urllib.error.HTTPError as e:
            status, headers, body = e.code, e.headers, e.read().decode(errors="replace")
        except urllib.error.URLError as e:
            print(f"error {e.reason}")
            sys.exit(3)
        if status in (301, 302, 303, 307, 308):
            url = urllib.parse.urljoin(url, headers["Location"])
            data = None
            continue
        form = re.search(r'<form[^>]*action="([^"]+)"', body)
        if status == 200 and form and "/interaction/" in form.group(1):
            action = urllib.parse.urljoin(url, form.group(1).replace("&amp;", "&"))
            fields = dict(re.findall(r'<input[^>]*name="([^"]+)"[^>]*value="([^"]*)"', body))
            if 'name="login"' in body:
                fields.update({"login": login, "password": "any"})
            url, data = action, urllib.parse.urlencode(fields).encode()
            continue
        print(status)
        print(body)
        cookies()
        sys.exit(0 if status == 200 else 1)
    print("too many redirects")
    sys.exit(2)


if __name__ == "__main__":
    main()
