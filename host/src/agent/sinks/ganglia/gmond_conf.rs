//! The send channels of a `gmond.conf`: where gmetric and libganglia send metrics.
//!
//! Only the `udp_send_channel` sections are read, and in them only `host`, `mcast_join`,
//! `port` (default 8649) and `ttl` (default 1); the rest of the file (and its `include`s)
//! is skipped. The syntax is libconfuse's: `key = value`, values bare or in double quotes,
//! sections in braces, comments after `#` or `//` and between `/*` and `*/`.

/// One `udp_send_channel`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SendChannel {
    /// The address or host name sent to (`host`, or the multicast group `mcast_join`).
    pub host: String,
    /// The port.
    pub port: u16,
    /// Whether `host` is a multicast group.
    pub multicast: bool,
    /// The multicast time-to-live.
    pub ttl: u32,
}

#[derive(Debug, PartialEq)]
enum Token {
    Word(String),
    Punct(char),
}

fn tokens(text: &str) -> Result<Vec<Token>, String> {
    let mut out = Vec::new();
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            c if c.is_whitespace() => {}
            '#' => {
                for c in chars.by_ref() {
                    if c == '\n' {
                        break;
                    }
                }
            }
            '/' if chars.peek() == Some(&'/') => {
                for c in chars.by_ref() {
                    if c == '\n' {
                        break;
                    }
                }
            }
            '/' if chars.peek() == Some(&'*') => {
                chars.next();
                let mut last = ' ';
                let mut closed = false;
                for c in chars.by_ref() {
                    if last == '*' && c == '/' {
                        closed = true;
                        break;
                    }
                    last = c;
                }
                if !closed {
                    return Err("a comment opened with /* is not closed".to_owned());
                }
            }
            '{' | '}' | '=' | '(' | ')' | ',' => out.push(Token::Punct(c)),
            '"' | '\'' => {
                let quote = c;
                let mut word = String::new();
                let mut closed = false;
                while let Some(c) = chars.next() {
                    match c {
                        '\\' => {
                            if let Some(next) = chars.next() {
                                word.push(next);
                            }
                        }
                        c if c == quote => {
                            closed = true;
                            break;
                        }
                        c => word.push(c),
                    }
                }
                if !closed {
                    return Err("a quoted value is not closed".to_owned());
                }
                out.push(Token::Word(word));
            }
            c => {
                let mut word = String::from(c);
                while let Some(&next) = chars.peek() {
                    if next.is_whitespace() || "{}=(),\"'#".contains(next) {
                        break;
                    }
                    word.push(next);
                    chars.next();
                }
                out.push(Token::Word(word));
            }
        }
    }
    Ok(out)
}

/// The `udp_send_channel` sections of `text`.
pub fn send_channels(text: &str) -> Result<Vec<SendChannel>, String> {
    let tokens = tokens(text)?;
    let mut channels = Vec::new();
    let mut depth = 0usize;
    let mut i = 0;
    while i < tokens.len() {
        match &tokens[i] {
            Token::Punct('{') => depth += 1,
            Token::Punct('}') => depth = depth.saturating_sub(1),
            Token::Word(w)
                if depth == 0
                    && w == "udp_send_channel"
                    && tokens.get(i + 1) == Some(&Token::Punct('{')) =>
            {
                let (channel, next) = channel(&tokens, i + 2)?;
                channels.push(channel);
                i = next;
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    Ok(channels)
}

/// Reads one section's keys from `start` (after its `{`); returns the channel and the
/// position after its `}`.
fn channel(tokens: &[Token], start: usize) -> Result<(SendChannel, usize), String> {
    let (mut host, mut mcast, mut port, mut ttl) = (None, None, None, None);
    let mut depth = 0usize;
    let mut i = start;
    loop {
        match tokens.get(i) {
            None => return Err("a udp_send_channel section is not closed".to_owned()),
            Some(Token::Punct('{')) => depth += 1,
            Some(Token::Punct('}')) if depth == 0 => break,
            Some(Token::Punct('}')) => depth -= 1,
            Some(Token::Word(key))
                if depth == 0 && tokens.get(i + 1) == Some(&Token::Punct('=')) =>
            {
                let Some(Token::Word(value)) = tokens.get(i + 2) else {
                    return Err(format!("udp_send_channel: {key} has no value"));
                };
                match key.as_str() {
                    "host" => host = Some(value.clone()),
                    "mcast_join" => mcast = Some(value.clone()),
                    "port" => {
                        port = Some(value.parse::<u16>().map_err(|_| {
                            format!("udp_send_channel: port {value:?} is not a port number")
                        })?)
                    }
                    "ttl" => {
                        ttl = Some(value.parse::<u32>().map_err(|_| {
                            format!("udp_send_channel: ttl {value:?} is not a number")
                        })?)
                    }
                    _ => {}
                }
                i += 3;
                continue;
            }
            Some(_) => {}
        }
        i += 1;
    }
    let (host, multicast) = match (mcast, host) {
        (Some(group), _) => (group, true),
        (None, Some(host)) => (host, false),
        (None, None) => {
            return Err("a udp_send_channel names neither host nor mcast_join".to_owned());
        }
    };
    Ok((
        SendChannel {
            host,
            port: port.unwrap_or(8649),
            multicast,
            ttl: ttl.unwrap_or(1),
        },
        i + 1,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn send_channels_are_read_past_comments_and_other_sections() {
        let text = r#"
/* This configuration is as close to 2.5.x default behavior as possible
   The values closely match ./gmond/metric.h definitions in 2.5.x */
globals { daemonize = yes  setuid = yes  user = ganglia }
cluster { name = "fritz" }
udp_send_channel {
  #bind_hostname = yes
  mcast_join = 239.2.11.71
  port = 8649
  ttl = 1
}
udp_send_channel { host = "gmond01.example" port = 8650 }  // the collector
udp_recv_channel { mcast_join = 239.2.11.71 port = 8649 bind = 239.2.11.71 }
collection_group { collect_every = 20 metric { name = "load_one" title = "One Minute Load Average" } }
include ('/etc/ganglia/conf.d/*.conf')
"#;
        assert_eq!(
            send_channels(text).unwrap(),
            vec![
                SendChannel {
                    host: "239.2.11.71".into(),
                    port: 8649,
                    multicast: true,
                    ttl: 1
                },
                SendChannel {
                    host: "gmond01.example".into(),
                    port: 8650,
                    multicast: false,
                    ttl: 1
                },
            ]
        );
        assert!(
            send_channels("udp_send_channel { port = 1 }")
                .unwrap_err()
                .contains("neither")
        );
        assert!(
            send_channels("udp_send_channel { host = x port = 99999 }")
                .unwrap_err()
                .contains("port")
        );
        assert!(send_channels("udp_send_channel { host = x").is_err());
    }
}
