//! Who may act: reading needs nothing (the dashboard binds to loopback
//! unless told otherwise), acting needs the configured token. A visitor
//! signs in with it once and gets a session cookie (`HttpOnly`,
//! `SameSite=Strict`); every action's form also carries the session's CSRF
//! token, checked against the session, so another site can neither read
//! nor forge one.

use std::collections::HashMap;
use std::sync::Mutex;

use super::http::Request;

/// The session cookie's name.
pub const COOKIE: &str = "outbox_session";
/// Sessions kept at most (the oldest is forgotten first).
const MAX_SESSIONS: usize = 1_000;

/// Signed-in sessions: their cookie value and CSRF token.
#[derive(Default)]
pub struct Sessions {
    /// Session id → CSRF token; `order` says which came first.
    live: Mutex<(HashMap<String, String>, Vec<String>)>,
}

/// Why an action was refused.
#[derive(Debug, PartialEq, Eq)]
pub enum Refused {
    /// No token is configured: the dashboard is read-only.
    ReadOnly,
    /// Not signed in (no or unknown session).
    NotSignedIn,
    /// The form's CSRF token is missing or not the session's.
    BadCsrf,
}

impl Refused {
    /// What the refusal page says.
    pub fn explain(&self) -> &'static str {
        match self {
            Self::ReadOnly => {
                "This dashboard is read-only: start it with a token (--token or OUTBOX_DASHBOARD_TOKEN) to act."
            }
            Self::NotSignedIn => "Sign in with the dashboard's token to act.",
            Self::BadCsrf => {
                "The form's CSRF token is missing or stale; reload the page and try again."
            }
        }
    }
}

impl Sessions {
    /// Starts a session; returns its id (the cookie's value).
    pub fn start(&self) -> String {
        let id = random_token();
        let mut live = self.live.lock().unwrap_or_else(|e| e.into_inner());
        let (by_id, order) = &mut *live;
        if order.len() >= MAX_SESSIONS {
            let oldest = order.remove(0);
            by_id.remove(&oldest);
        }
        by_id.insert(id.clone(), random_token());
        order.push(id.clone());
        id
    }

    /// Ends the request's session, if any.
    pub fn end(&self, request: &Request) {
        if let Some(id) = request.cookie(COOKIE) {
            let mut live = self.live.lock().unwrap_or_else(|e| e.into_inner());
            live.0.remove(id);
            live.1.retain(|kept| kept != id);
        }
    }

    /// The CSRF token of the request's session, if it is signed in.
    pub fn csrf_of(&self, request: &Request) -> Option<String> {
        let id = request.cookie(COOKIE)?;
        let live = self.live.lock().unwrap_or_else(|e| e.into_inner());
        live.0.get(id).cloned()
    }

    /// Whether `request` may act: signed in, and its form carries the
    /// session's CSRF token.
    pub fn authorize(&self, request: &Request, actions_enabled: bool) -> Result<(), Refused> {
        if !actions_enabled {
            return Err(Refused::ReadOnly);
        }
        let csrf = self.csrf_of(request).ok_or(Refused::NotSignedIn)?;
        if same(request.field("csrf"), &csrf) {
            Ok(())
        } else {
            Err(Refused::BadCsrf)
        }
    }
}

/// Compares in time that does not depend on where the inputs differ.
pub fn same(given: &str, expected: &str) -> bool {
    given.len() == expected.len()
        && given
            .bytes()
            .zip(expected.bytes())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0
}

/// 244 random bits, hex (two version-4 UUIDs from the OS's generator).
fn random_token() -> String {
    format!(
        "{}{}",
        uuid::Uuid::new_v4().simple(),
        uuid::Uuid::new_v4().simple()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(cookie: Option<&str>, csrf: &str) -> Request {
        let mut request = Request::default();
        if let Some(id) = cookie {
            request
                .headers
                .insert("cookie".into(), format!("{COOKIE}={id}"));
        }
        request.form.insert("csrf".into(), csrf.into());
        request
    }

    #[test]
    fn an_action_needs_a_session_and_its_own_csrf_token() {
        let sessions = Sessions::default();
        let id = sessions.start();
        let other = sessions.start();
        let csrf = sessions.csrf_of(&request(Some(&id), "")).unwrap();
        assert_eq!(sessions.authorize(&request(Some(&id), &csrf), true), Ok(()));
        assert_eq!(
            sessions.authorize(&request(Some(&id), &csrf), false),
            Err(Refused::ReadOnly)
        );
        assert_eq!(
            sessions.authorize(&request(None, &csrf), true),
            Err(Refused::NotSignedIn)
        );
        assert_eq!(
            sessions.authorize(&request(Some(&other), &csrf), true),
            Err(Refused::BadCsrf)
        );
        assert_eq!(
            sessions.authorize(&request(Some(&id), ""), true),
            Err(Refused::BadCsrf)
        );
        sessions.end(&request(Some(&id), ""));
        assert_eq!(
            sessions.authorize(&request(Some(&id), &csrf), true),
            Err(Refused::NotSignedIn)
        );
    }

    #[test]
    fn tokens_compare_whole() {
        assert!(same("abc", "abc"));
        assert!(!same("abc", "abd"));
        assert!(!same("ab", "abc"));
    }
}
