//! The hot paths allocate nothing per line: a counting global allocator watches them.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use ccfleet::lineproto::{Decoder, FieldValue};
use ccfleet::wire;

struct Counting;

thread_local! {
    // Per thread, so tests running in parallel do not count each other's allocations.
    static ALLOCATIONS: Cell<usize> = const { Cell::new(0) };
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.with(|n| n.set(n.get() + 1));
        // SAFETY: forwards the caller's layout unchanged to the system allocator.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `System.alloc` with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn allocations_during(f: impl FnOnce()) -> usize {
    let before = ALLOCATIONS.with(Cell::get);
    f();
    ALLOCATIONS.with(Cell::get) - before
}

#[test]
fn heartbeat_fan_in_allocates_nothing() {
    let ids: Vec<String> = (0..1000).map(|i| format!("{i:032x}")).collect();
    let refs: Vec<&str> = ids.iter().map(String::as_str).collect();
    let message = wire::encode_heartbeat(1_734_000_000_000_000_000, &refs).unwrap();
    let mut accepted = 0;
    let allocations = allocations_during(|| {
        wire::scan_heartbeats(&message, |line| {
            if let wire::HeartbeatLine::Accepted(id) = line {
                accepted += usize::from(!id.is_empty());
            }
        })
        .unwrap();
    });
    assert_eq!(accepted, 1000);
    assert_eq!(allocations, 0, "scan_heartbeats allocated");
}

#[test]
fn generic_decode_allocates_nothing_without_escapes() {
    let text: String = (0..1000)
        .map(|i| format!("load_one,cluster=fritz,hostname=f{i:04},type=node value={i}.5,ok=true,n={i}i,s=\"x y\" {i}\n"))
        .collect();
    let mut total = 0.0;
    let mut scratch = String::with_capacity(64);
    let allocations = allocations_during(|| {
        for line in Decoder::new(text.as_bytes()) {
            let line = line.unwrap();
            total += line.measurement().unescape_with(&mut scratch).len() as f64;
            for (k, v) in line.tags() {
                total += (k.unescape().len() + v.unescape().len()) as f64;
            }
            for (_, v) in line.fields() {
                if let FieldValue::Float(f) = v {
                    total += f;
                }
            }
        }
    });
    assert!(total > 0.0);
    assert_eq!(allocations, 0, "decoding allocated");
}

#[test]
fn lines_with_more_tags_and_fields_than_the_decoder_keeps_allocate_nothing() {
    // Past the first few tags and fields, which every line keeps, the tags are scanned
    // again when read and the fields are kept in a table of the thread's: the storage of
    // that table is allocated by the first lines on a thread, and then reused by every
    // decoder (one per message, as the server makes them).
    let seven: String = (0..500)
        .map(|i| {
            format!(
                "m,a=1,b=2,c=3,d=4,e=5,f\\ g=6 f0={i}i,f1={i}.25,f2=true,f3=\"s\",f4=-{i},f5={i}u,f6=\"t u\" {i}\n"
            )
        })
        .collect();
    let many: String = (0..200)
        .map(|i| {
            let fields: Vec<String> = (0..52).map(|f| format!("f{f}={}i", i * f)).collect();
            format!("procstat,exe=bash {} {i}\n", fields.join(","))
        })
        .collect();
    let read = |text: &str| {
        let mut sum = 0usize;
        for line in Decoder::new(text.as_bytes()) {
            let line = line.unwrap();
            for (k, v) in line.tags() {
                sum += k.raw().len() + v.raw().len();
            }
            for (k, v) in line.fields() {
                sum += k.raw().len();
                if let FieldValue::Int(n) = v {
                    sum += n as usize;
                }
            }
        }
        sum
    };
    // The first message on this thread allocates the table's storage.
    let warm = read(&many) + read(&seven);
    let mut sum = 0;
    let allocations = allocations_during(|| {
        for _ in 0..3 {
            sum += read(&seven) + read(&many);
        }
    });
    assert_eq!(sum, 3 * warm);
    assert_eq!(allocations, 0, "decoding allocated");
}
