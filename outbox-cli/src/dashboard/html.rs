//! Pages as strings: every value that comes from the database goes through
//! [`esc`], so a payload, key, error text or header holding markup shows as
//! text. Attributes are always double-quoted, so escaping `"` suffices there.

use std::fmt::Write;

/// `text` with the five characters that can open markup or close an
/// attribute replaced by entities.
pub fn esc(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// A query string value (for links that carry filters).
pub fn url_value(text: &str) -> String {
    form_urlencoded::byte_serialize(text.as_bytes()).collect()
}

/// What every page shares.
pub struct Frame<'a> {
    /// Where the dashboard is mounted (`""`, or `/ui` under the daemon).
    pub base: &'a str,
    /// The store's kind (`PostgreSQL`, …); never its URL.
    pub store: &'a str,
    /// Whether the visitor may act (signed in with the token).
    pub signed_in: bool,
    /// Whether actions exist at all (a token is configured).
    pub actions_enabled: bool,
    /// The visitor's CSRF token, for forms.
    pub csrf: Option<&'a str>,
    /// The tenant shown, under a picker.
    pub tenant: Option<&'a super::TenantOf>,
}

impl Frame<'_> {
    /// A whole page around `main`.
    pub fn page(&self, title: &str, main: &str) -> String {
        let base = self.base;
        let mut account = String::new();
        if self.signed_in {
            let _ = write!(
                account,
                r#"<form method="post" action="{base}/logout" class="inline">{}<button>Sign out</button></form>"#,
                self.csrf_field()
            );
        } else if self.actions_enabled {
            let _ = write!(account, r#"<a href="{base}/login">Sign in to act</a>"#);
        } else {
            account.push_str("<span class=\"muted\">read-only (no token configured)</span>");
        }
        let tenant = self.tenant.map_or_else(String::new, |t| {
            format!(
                r#"<span class="tenant">tenant <b id="tenant">{}</b> · <a id="all-tenants" href="{}/">all tenants</a></span>"#,
                esc(&t.name),
                t.picker
            )
        });
        format!(
            r#"<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title} · outbox</title><link rel="stylesheet" href="{base}/assets/app.css"><script src="{base}/assets/app.js" defer></script></head>
<body><header><a class="brand" href="{base}/">outbox</a><nav><a href="{base}/">Overview</a><a href="{base}/failed">Failed</a></nav>{tenant}<span class="store">{store}</span><span class="account">{account}</span></header>
<main id="main">{main}</main></body></html>"#,
            title = esc(title),
            store = esc(self.store),
        )
    }

    /// The hidden CSRF field every form carries.
    pub fn csrf_field(&self) -> String {
        self.csrf
            .map(|token| {
                format!(
                    r#"<input type="hidden" name="csrf" value="{}">"#,
                    esc(token)
                )
            })
            .unwrap_or_default()
    }
}

/// A table: headers, then rows of already-escaped cells.
pub fn table(id: &str, headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut out = format!(r#"<table id="{id}"><thead><tr>"#);
    for header in headers {
        let _ = write!(out, "<th>{}</th>", esc(header));
    }
    out.push_str("</tr></thead><tbody>");
    for row in rows {
        out.push_str("<tr>");
        for cell in row {
            let _ = write!(out, "<td>{cell}</td>");
        }
        out.push_str("</tr>");
    }
    out.push_str("</tbody></table>");
    out
}

/// A duration in the largest unit that keeps it short (`42 s`, `3.5 min`).
pub fn age(seconds: f64) -> String {
    match seconds {
        s if s < 120.0 => format!("{s:.0} s"),
        s if s < 7200.0 => format!("{:.1} min", s / 60.0),
        s if s < 172_800.0 => format!("{:.1} h", s / 3600.0),
        s => format!("{:.1} d", s / 86_400.0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markup_from_the_database_becomes_text() {
        assert_eq!(
            esc(r#"<img src=x onerror="alert('1')">&"#),
            "&lt;img src=x onerror=&quot;alert(&#39;1&#39;)&quot;&gt;&amp;"
        );
    }

    #[test]
    fn ages_read_at_a_glance() {
        assert_eq!(age(42.0), "42 s");
        assert_eq!(age(210.0), "3.5 min");
        assert_eq!(age(3.0 * 86_400.0), "3.0 d");
    }
}
