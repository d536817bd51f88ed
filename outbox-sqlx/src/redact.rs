//! Database URLs as they may be shown: in logs, errors and `Debug`.

/// `url` with its password replaced by `***` (a URL without one, or that
/// is no URL, as it is).
pub fn without_password(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    match authority.rsplit_once('@') {
        Some((userinfo, host)) => match userinfo.split_once(':') {
            Some((user, _password)) => format!("{scheme}://{user}:***@{host}{tail}"),
            None => url.to_owned(),
        },
        None => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::without_password;

    #[test]
    fn only_the_password_is_hidden() {
        assert_eq!(
            without_password("postgres://app:s3cret@db:5432/acme?sslmode=require"),
            "postgres://app:***@db:5432/acme?sslmode=require"
        );
        assert_eq!(
            without_password("redis://:p%40ss@cache:6379/0"),
            "redis://:***@cache:6379/0"
        );
        assert_eq!(
            without_password("mysql://root@127.0.0.1:3306/t"),
            "mysql://root@127.0.0.1:3306/t"
        );
        assert_eq!(without_password("sqlite::memory:"), "sqlite::memory:");
    }
}
