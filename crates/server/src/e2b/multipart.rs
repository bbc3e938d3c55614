//! A bounded `multipart/form-data` reader for `/files` uploads: the body is already in
//! memory (under the upload limit), so a part is a range of it. Hostile input gets an error
//! naming what is wrong; parts without a `file` name are ignored.

use std::ops::Range;

use axum::http::{HeaderMap, header};

/// Files one upload may carry.
const MAX_PARTS: usize = 1000;

pub(super) struct Part {
    pub(super) filename: Option<String>,
    pub(super) data: Range<usize>,
}

fn find(hay: &[u8], needle: &[u8], from: usize) -> Option<usize> {
    if from > hay.len() {
        return None;
    }
    hay[from..]
        .windows(needle.len())
        .position(|w| w == needle)
        .map(|i| i + from)
}

fn boundary(headers: &HeaderMap) -> Result<String, String> {
    let ct = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if !ct.trim_start().starts_with("multipart/form-data") {
        return Err(format!(
            "the upload's content type is {ct:?}; send multipart/form-data with one `file` part per file"
        ));
    }
    ct.split(';')
        .filter_map(|p| p.trim().strip_prefix("boundary="))
        .map(|b| b.trim_matches('"').to_string())
        .find(|b| (1..=70).contains(&b.len()))
        .ok_or_else(|| "the multipart content type has no valid boundary".to_string())
}

/// The `file` parts of a multipart body.
pub(super) fn parse(headers: &HeaderMap, body: &[u8]) -> Result<Vec<Part>, String> {
    let delim = format!("--{}", boundary(headers)?).into_bytes();
    let mut pos = find(body, &delim, 0).ok_or("the multipart body has no part")? + delim.len();
    let mut parts = Vec::new();
    loop {
        if body[pos..].starts_with(b"--") {
            break;
        }
        if !body[pos..].starts_with(b"\r\n") {
            return Err("a multipart boundary is not followed by a line end".into());
        }
        let head_start = pos + 2;
        let head_end =
            find(body, b"\r\n\r\n", head_start).ok_or("a multipart part has no end of headers")?;
        let head = String::from_utf8_lossy(&body[head_start..head_end]).into_owned();
        let data_start = head_end + 4;
        let mut end_delim = b"\r\n".to_vec();
        end_delim.extend_from_slice(&delim);
        let data_end = find(body, &end_delim, data_start)
            .ok_or("a multipart part is not closed by its boundary")?;
        if let Some(filename) = disposition(&head) {
            if parts.len() >= MAX_PARTS {
                return Err(format!("more than {MAX_PARTS} files in one upload"));
            }
            parts.push(Part {
                filename,
                data: data_start..data_end,
            });
        }
        pos = data_end + end_delim.len();
    }
    if parts.is_empty() {
        return Err("the upload has no `file` part".into());
    }
    Ok(parts)
}

/// For a `file` part: Some(its filename, if it has one); None for any other part.
fn disposition(head: &str) -> Option<Option<String>> {
    let line = head
        .lines()
        .find(|l| l.to_ascii_lowercase().starts_with("content-disposition:"))?;
    let mut name = None;
    let mut filename = None;
    for param in line.split(';').skip(1) {
        let (k, v) = param.trim().split_once('=')?;
        let v = v.trim().trim_matches('"').replace("%22", "\"");
        match k.trim() {
            "name" => name = Some(v),
            "filename" => filename = Some(v),
            _ => {}
        }
    }
    (name.as_deref() == Some("file")).then_some(filename)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(ct: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::CONTENT_TYPE, ct.parse().unwrap());
        h
    }

    #[test]
    fn reads_files_and_refuses_broken_bodies() {
        let h = headers("multipart/form-data; boundary=XyZ");
        let body = b"--XyZ\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a/b.txt\"\r\n\r\nhello\r\n--XyZ\r\nContent-Disposition: form-data; name=\"file\"; filename=\"c\"\r\nContent-Type: application/octet-stream\r\n\r\n\x00\x01\r\n--XyZ--\r\n";
        let parts = parse(&h, body).unwrap();
        assert_eq!(parts.len(), 2);
        assert_eq!(parts[0].filename.as_deref(), Some("a/b.txt"));
        assert_eq!(&body[parts[0].data.clone()], b"hello");
        assert_eq!(&body[parts[1].data.clone()], b"\x00\x01");
        assert!(
            parse(
                &h,
                b"--XyZ\r\nContent-Disposition: form-data; name=\"file\"\r\n\r\nno end"
            )
            .is_err()
        );
        assert!(parse(&headers("text/plain"), body).is_err());
        assert!(parse(&h, b"nothing").is_err());
    }
}
