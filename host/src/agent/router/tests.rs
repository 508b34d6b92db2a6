//! The router against every example of cc-metric-collector's router documentation and
//! cc-lib's message processor documentation, and the expression parser against hostile
//! input.

use serde_json::{Value as Json, json};

use super::expr::{Expr, MAX_DEPTH, Mode, Place, Scope, Value, Var};
use super::message::{Message, MessageScope};
use super::processor::{Processor, ProcessorConfig};
use super::topology::{HwThread, Topology};
use super::{Router, RouterConfig};

const NOW: i64 = 1_700_000_003_000_000_000;

/// Two sockets of two cores of two hardware threads; NUMA domain = socket.
fn topology() -> Topology {
    Topology::new(
        (0..8)
            .map(|cpu| HwThread {
                cpu,
                core: (cpu % 4) / 2 + (cpu / 4) * 2,
                socket: cpu / 4,
                die: cpu / 4,
                numa: cpu / 4,
            })
            .collect(),
    )
}

fn router(config: Json) -> Router {
    let config: RouterConfig = serde_json::from_value(config).expect("router config parses");
    Router::with_topology(
        &config,
        "node01.example.org",
        std::sync::Arc::new(topology()),
    )
    .expect("router compiles")
}

fn refused(config: Json) -> String {
    let config: RouterConfig = serde_json::from_value(config).expect("router config parses");
    Router::new(&config, "node01").expect_err("router refuses")
}

/// Routes `input` and gives the output lines, sorted (tags are sorted by the encoder).
fn route(r: &mut Router, input: &str) -> Vec<String> {
    let out = r.route(input.as_bytes(), NOW);
    let text = String::from_utf8(out.lines).unwrap();
    let lines: Vec<String> = text.lines().map(str::to_owned).collect();
    assert_eq!(lines.len(), out.points);
    lines
}

fn processor(config: Json) -> Processor {
    let config: ProcessorConfig = serde_json::from_value(config).expect("processor config parses");
    Processor::new(&config, "process_messages").expect("processor compiles")
}

fn message(line: &str) -> Message {
    let l = ccfleet::lineproto::Decoder::new(line.as_bytes())
        .next()
        .unwrap()
        .unwrap();
    Message::new(ccfleet::lineproto::Point::from_line(&l))
}

/// Processes one line; `None` when dropped.
fn process(p: &Processor, line: &str) -> Option<Message> {
    let mut m = message(line);
    p.process(&mut m).unwrap().then_some(m)
}

fn condition(src: &str, line: &str) -> bool {
    let e = Expr::parse(src, Mode::Condition).unwrap();
    let m = message(line);
    let env = Default::default();
    let topology = topology();
    e.eval_bool(&MessageScope {
        msg: &m,
        env: &env,
        topology: &topology,
    })
    .unwrap()
}

// ---- cc-metric-collector's router README ----

/// The README's full example (its `process_messages` placeholder included).
fn readme_router() -> Json {
    json!({
        "num_cache_intervals" : 1,
        "interval_timestamp" : true,
        "hostname_tag" : "hostname",
        "max_forward" : 50,
        "process_messages": {"see": "pkg/messageProcessor/README.md"},
        "add_tags" : [
            {"key" : "cluster", "value" : "testcluster", "if" : "*"},
            {"key" : "test", "value" : "testing", "if" : "name == 'temp_package_id_0'"}
        ],
        "delete_tags" : [{"key" : "unit", "value" : "*", "if" : "*"}],
        "interval_aggregates" : [{
            "name" : "temp_cores_avg",
            "if" : "match('temp_core_%d+', metric.Name())",
            "function" : "avg(values)",
            "tags" : {"type" : "node"},
            "meta" : {"group": "IPMI", "unit": "degC", "source": "TempCollector"}
        }],
        "drop_metrics" : ["not_interesting_metric_at_all"],
        "drop_metrics_if" : ["match('temp_core_%d+', metric.Name())"],
        "rename_metrics" : {"metric_12345" : "mymetric"},
        "normalize_units" : true,
        "change_unit_prefix" : {"mem_used" : "G", "mem_total" : "G"}
    })
}

#[test]
fn the_router_readme_example_tags_drops_renames_and_stamps() {
    let mut r = router(readme_router());
    assert!(r.is_active());
    let out = route(
        &mut r,
        "temp_package_id_0,type=node,unit=degC value=45 1700000001000000000\n\
         temp_core_3,type=node value=50 1700000001000000000\n\
         not_interesting_metric_at_all,type=node value=1 1700000001000000000\n\
         metric_12345,hostname=other,type=node value=7i 1700000001000000000\n",
    );
    // interval_timestamp: the start of the 10 s interval holding NOW.
    let stamp = 1_700_000_000_000_000_000i64;
    assert_eq!(
        out,
        vec![
            format!(
                "temp_package_id_0,cluster=testcluster,hostname=node01,test=testing,type=node value=45 {stamp}"
            ),
            format!("mymetric,cluster=testcluster,hostname=other,type=node value=7i {stamp}"),
        ]
    );
}

#[test]
fn the_router_readme_example_still_aggregates_the_metrics_it_drops() {
    let mut r = router(readme_router());
    let t0 = 1_700_000_000_000_000_000i64;
    let out = r.route(
        b"temp_core_0,type=node,unit=degC value=50 1\n\
          temp_core_1,type=node,unit=degC value=54 1\n\
          temp_package_id_0,type=node value=45 1\n",
        t0 + 3_000_000_000,
    );
    assert_eq!((out.points, out.dropped), (1, 2));
    assert_eq!(r.flush(t0 + 9_999_999_999).points, 0);
    let out = r.flush(t0 + 10_000_000_000);
    // The aggregate passes the processor too: the wildcard tag, the hostname.
    assert_eq!(
        String::from_utf8(out.lines).unwrap(),
        format!("temp_cores_avg,cluster=testcluster,hostname=node01,type=node value=52 {t0}\n")
    );
    assert_eq!(r.counters().aggregated, 1);
}

/// cc-metric-collector's `example-configs/router.json`.
#[test]
fn the_example_router_configuration_tags_and_stamps() {
    let mut r = router(json!({
        "process_messages" : {
            "add_tags_if": [
                {"key" : "cluster", "value" : "testcluster", "if" : "true"},
                {"key" : "test", "value" : "testing", "if" : "name == 'temp_package_id_0'"}
            ],
            "delete_meta_if": [{"key" : "unit", "if" : "true"}]
        },
        "interval_timestamp" : true
    }));
    let out = route(
        &mut r,
        "temp_package_id_0,type=socket,type-id=0 value=45 1\ncpu_load,type=node value=1.5 1\n",
    );
    let stamp = 1_700_000_000_000_000_000i64;
    assert_eq!(
        out,
        [
            format!(
                "temp_package_id_0,cluster=testcluster,hostname=node01,test=testing,type=socket,type-id=0 value=45 {stamp}"
            ),
            format!("cpu_load,cluster=testcluster,hostname=node01,type=node value=1.5 {stamp}"),
        ]
    );
}

#[test]
fn the_topology_example_drops_the_hardware_threads_of_socket_one() {
    let mut r = router(json!({"process_messages": {
        "drop_messages_if": ["tag_type-id in getCpuListOfType(\"socket\", \"1\")"]
    }}));
    let input: String = (0..8)
        .map(|cpu| format!("cpu_user,hostname=h,type=hwthread,type-id={cpu} value={cpu} 1\n"))
        .collect();
    let out = route(&mut r, &input);
    let kept: Vec<String> = (0..4)
        .map(|cpu| format!("cpu_user,hostname=h,type=hwthread,type-id={cpu} value={cpu} 1"))
        .collect();
    assert_eq!(out, kept);
}

#[test]
fn the_topology_functions_read_the_topology() {
    let line = "cpu_user,type=hwthread,type-id=5 value=1 1";
    for (cond, want) in [
        (
            "getCpuSocket(5) == 1 && getCpuCore(type-id) == 2 && getCpuNuma(0) == 0",
            true,
        ),
        ("getCpuDie(7) == 1 && getCpuSocket(99) == nil", true),
        ("len(getCpuList()) == 8 && 7 in getCpuList()", true),
        (
            "type-id in getSockCpuList(1) && type-id in getNumaCpuList(1)",
            true,
        ),
        (
            "type-id in getDieCpuList(0) || type-id in getCoreCpuList(0)",
            false,
        ),
        ("getCoreCpuList(2) == [4, 5]", true),
        ("type-id in getCpuListOfType('node', 0)", true),
        (
            "type-id in getCpuListOfType('core', 2) && type-id in getCpuListOfType('hwthread', 5)",
            true,
        ),
    ] {
        assert_eq!(condition(cond, line), want, "{cond}");
    }
}

#[test]
fn rename_metrics_renames_by_name() {
    let mut r = router(json!({"rename_metrics": {"oldname" : "newname", "clock_mhz" : "clock"}}));
    let out = route(
        &mut r,
        "clock_mhz,hostname=h value=2400 1\nother,hostname=h value=1 1\n",
    );
    assert_eq!(
        out,
        [
            "clock,hostname=h value=2400 1",
            "other,hostname=h value=1 1"
        ]
    );
}

#[test]
fn add_tags_turn_a_node_temperature_into_a_socket_one() {
    let mut r = router(json!({"add_tags": [
        {"key" : "type", "value" : "socket", "if" : "name == 'temp_package_id_0'"},
        {"key" : "type-id", "value" : "0", "if" : "name == 'temp_package_id_0'"}
    ]}));
    let out = route(
        &mut r,
        "temp_package_id_0,hostname=h,type=node value=40 1\ntemp_core_0,hostname=h,type=node value=41 1\n",
    );
    assert_eq!(
        out,
        [
            "temp_package_id_0,hostname=h,type=socket,type-id=0 value=40 1",
            "temp_core_0,hostname=h,type=node value=41 1"
        ]
    );
}

#[test]
fn add_tags_with_the_wildcard_tag_every_metric() {
    let mut r =
        router(json!({"add_tags": [{"key" : "cluster", "value" : "testcluster", "if" : "*"}]}));
    let out = route(&mut r, "a,hostname=h value=1 1\nb,hostname=h value=2 1\n");
    assert_eq!(
        out,
        [
            "a,cluster=testcluster,hostname=h value=1 1",
            "b,cluster=testcluster,hostname=h value=2 1"
        ]
    );
}

#[test]
fn delete_tags_without_value_remove_the_key() {
    let mut r = router(json!({"delete_tags": [{"key" : "unit", "if" : "*"}]}));
    let out = route(&mut r, "a,hostname=h,unit=B value=1 1\n");
    assert_eq!(out, ["a,hostname=h value=1 1"]);
}

#[test]
fn drop_metrics_drops_by_name() {
    let mut r = router(json!({"drop_metrics": ["drop_metric_1", "drop_metric_2"]}));
    let out = route(
        &mut r,
        "drop_metric_1,hostname=h value=1 1\ndrop_metric_2,hostname=h value=1 1\nkeep,hostname=h value=1 1\n",
    );
    assert_eq!(out, ["keep,hostname=h value=1 1"]);
}

#[test]
fn drop_metrics_if_drops_by_regex_and_by_the_first_hardware_thread() {
    let mut r = router(json!({"drop_metrics_if": [
        "match('drop_metric_%d+', name)",
        "match('cpu', type) && type-id == 0"
    ]}));
    let out = route(
        &mut r,
        "drop_metric_12,hostname=h,type=node value=1 1\n\
         cpu_load,hostname=h,type=hwthread,type-id=0 value=1 1\n\
         cpu_user,hostname=h,type=cpu,type-id=0 value=1 1\n\
         cpu_user,hostname=h,type=cpu,type-id=1 value=2 1\n\
         drop_metric_x,hostname=h,type=node value=3 1\n",
    );
    assert_eq!(
        out,
        [
            "cpu_load,hostname=h,type=hwthread,type-id=0 value=1 1",
            "cpu_user,hostname=h,type=cpu,type-id=1 value=2 1",
            "drop_metric_x,hostname=h,type=node value=3 1"
        ]
    );
}

#[test]
fn normalize_units_and_change_unit_prefix_convert_mem_used_to_gigabytes() {
    let mut r = router(json!({
        "normalize_units": true,
        "change_unit_prefix": {"mem_used" : "G", "mem_total" : "G"}
    }));
    let out = route(
        &mut r,
        "mem_used,hostname=h,unit=kB value=16000000 1\n\
         mem_free,hostname=h,unit=kByte value=5 1\n\
         cpu_freq,hostname=h,unit=MHz value=2400 1\n",
    );
    assert_eq!(
        out,
        [
            "mem_used,hostname=h,unit=GB value=16 1",
            "mem_free,hostname=h,unit=KB value=5 1",
            "cpu_freq,hostname=h,unit=MHz value=2400 1"
        ]
    );
}

#[test]
fn interval_aggregates_average_the_matching_values_of_the_last_interval() {
    let mut r = router(json!({
        "num_cache_intervals": 1,
        "interval": "10s",
        "interval_aggregates" : [{
            "name" : "new_metric_name",
            "if" : "match('sub_metric_%d+', metric.Name())",
            "function" : "avg(values)",
            "tags" : {"key" : "value", "type" : "node", "hostname": "<copy>"},
            "meta" : {"key" : "value", "group": "IPMI", "unit": "<copy>"}
        }]
    }));
    let t0 = 1_700_000_000_000_000_000i64;
    // The first batch opens the interval.
    let first = r.route(
        b"sub_metric_1,hostname=h value=10 1\nsub_metric_2,hostname=h value=20 1\nother,hostname=h value=99 1\n",
        t0 + 1_000,
    );
    assert_eq!(first.points, 3);
    // Nothing before the interval ends.
    assert_eq!(r.flush(t0 + 9_000_000_000).points, 0);
    let out = r.flush(t0 + 10_000_000_000);
    assert_eq!(
        String::from_utf8(out.lines).unwrap(),
        format!("new_metric_name,hostname=h,key=value,type=node value=15 {t0}\n")
    );
    // The next interval starts empty: no values, no point.
    assert_eq!(r.flush(t0 + 20_000_000_000).points, 0);
}

#[test]
fn the_mem_used_aggregate_sums_metrics_by_name() {
    let mut r = router(json!({
        "num_cache_intervals": 1,
        "interval_aggregates" : [{
            "name" : "mem_used",
            "if" : "source == 'MemstatCollector'",
            "function" : "sum(mem_total) - (sum(mem_free) + sum(mem_buffers) + sum(mem_cached))",
            "tags" : {"type" : "node"},
            "meta" : {"group": "<copy>", "unit": "<copy>", "source": "<copy>"}
        }],
        // Line protocol has no meta: a tag stands in for the collector's `source`.
        "process_messages": {"move_tag_to_meta_if": [{"if": "true", "key": "source", "value": "source"}]}
    }));
    let t0 = 1_700_000_000_000_000_000i64;
    r.route(
        b"mem_total,source=MemstatCollector,type=node value=100 1\n\
          mem_free,source=MemstatCollector,type=node value=10 1\n\
          mem_buffers,source=MemstatCollector,type=node value=5 1\n\
          mem_cached,source=MemstatCollector,type=node value=25 1\n\
          cpu_load,source=LoadavgCollector,type=node value=1 1\n",
        t0 + 5,
    );
    let out = r.flush(t0 + 10_000_000_000);
    assert_eq!(
        String::from_utf8(out.lines).unwrap(),
        format!("mem_used,hostname=node01,type=node value=60 {t0}\n")
    );
}

#[test]
fn aggregates_without_cache_intervals_are_refused() {
    let e = refused(
        json!({"interval_aggregates": [{"name": "x", "if": "true", "function": "sum(values)"}]}),
    );
    assert!(e.contains("num_cache_intervals"), "{e}");
}

#[test]
fn an_unknown_router_key_is_refused() {
    let config: Result<RouterConfig, _> = serde_json::from_value(json!({"add_tag": []}));
    assert!(config.is_err());
}

#[test]
fn an_empty_router_changes_nothing_and_is_left_out() {
    assert!(!router(json!({})).is_active());
    assert!(!router(json!({"max_forward": 10})).is_active());
    // A hostname tag of its own is a change: points get that tag.
    let mut r = router(json!({"hostname_tag": "host"}));
    assert!(r.is_active());
    assert_eq!(
        route(&mut r, "a,hostname=x value=1 1\n"),
        ["a,host=node01,hostname=x value=1 1"]
    );
}

// ---- cc-lib's message processor README ----

/// The README's configuration (its trailing comma in `add_base_env` removed: JSON).
fn readme_processor() -> Json {
    json!({
        "drop_messages": ["name_of_message_to_drop"],
        "drop_messages_if": [
            "condition_when_to_drop_message",
            "name == 'drop_this'",
            "tag.hostname == 'this_host'",
            "meta.unit != 'MB'"
        ],
        "rename_messages" : {"old_message_name" : "new_message_name"},
        "rename_messages_if": {"condition_when_to_rename_message" : "new_name"},
        "add_tags_if": [{"if" : "condition_when_to_add_tag", "key": "name_for_new_tag", "value": "new_tag_value"}],
        "delete_tags_if": [{"if" : "condition_when_to_delete_tag", "key": "name_of_tag"}],
        "add_meta_if": [{"if" : "condition_when_to_add_meta_info", "key": "name_for_new_meta_info", "value": "new_meta_info_value"}],
        "delete_meta_if": [{"if" : "condition_when_to_delete_meta_info", "key": "name_of_meta_info"}],
        "add_field_if": [{"if" : "condition_when_to_add_field", "key": "name_for_new_field", "value": "new_field_value_but_only_string_at_the_moment"}],
        "delete_field_if": [{"if" : "condition_when_to_delete_field", "key": "name_of_field"}],
        "move_tag_to_meta_if": [{"if" : "condition_when_to_move_tag_to_meta_info_including_its_value", "key": "name_of_tag", "value": "name_of_meta_info"}],
        "move_tag_to_field_if": [{"if" : "condition_when_to_move_tag_to_fields_including_its_value", "key": "name_of_tag", "value": "name_of_field"}],
        "move_meta_to_tag_if": [{"if" : "condition_when_to_move_meta_info_to_tags_including_its_value", "key": "name_of_meta_info", "value": "name_of_tag"}],
        "move_meta_to_field_if": [{"if" : "condition_when_to_move_meta_info_to_fields_including_its_value", "key": "name_of_tag", "value": "name_of_meta_info"}],
        "move_field_to_tag_if": [{"if" : "condition_when_to_move_field_to_tags_including_its_stringified_value", "key": "name_of_field", "value": "name_of_tag"}],
        "move_field_to_meta_if": [{"if" : "condition_when_to_move_field_to_meta_info_including_its_stringified_value", "key": "name_of_field", "value": "name_of_meta_info"}],
        "drop_by_message_type": ["metric", "event", "log", "control"],
        "change_unit_prefix": {
            "name == 'metric_with_wrong_unit_prefix'" : "G",
            "only_if_messagetype == 'metric'": "T"
        },
        "normalize_units": true,
        "add_base_env": {"MY_CONSTANT_FOR_CUSTOM_CONDITIONS": 1.0, "output_value_for_test_metrics": 42.0},
        "stage_order": ["rename_messages_if", "drop_messages"]
    })
}

#[test]
fn the_processor_readme_example_runs_only_the_stages_it_orders() {
    let p = processor(readme_processor());
    assert_eq!(
        process(&p, "name_of_message_to_drop,type=node value=1 1"),
        None
    );
    // drop_by_message_type would drop every metric, but stage_order leaves it out.
    let kept = process(&p, "drop_this,type=node value=1 1").expect("kept");
    assert_eq!(kept.name(), "drop_this");
    // Every stage in default order: drop_by_type drops the metric.
    let mut all = readme_processor();
    all.as_object_mut().unwrap().remove("stage_order");
    assert_eq!(process(&processor(all), "x,type=node value=1 1"), None);
}

#[test]
fn the_readme_drop_conditions_each_drop_what_they_say() {
    for (cond, dropped, kept) in [
        (
            "name == 'drop_this'",
            "drop_this value=1 1",
            "keep_this value=1 1",
        ),
        (
            "tag.hostname == 'this_host'",
            "m,hostname=this_host value=1 1",
            "m,hostname=other value=1 1",
        ),
        ("meta.unit != 'MB'", "m value=1 1", "never"),
    ] {
        let p = processor(json!({"drop_messages_if": [cond]}));
        assert_eq!(process(&p, dropped), None, "{cond}");
        if kept != "never" {
            assert!(process(&p, kept).is_some(), "{cond}");
        }
    }
    let p = processor(json!({
        "add_meta_if": [{"if": "true", "key": "unit", "value": "MB"}],
        "drop_messages_if": ["meta.unit != 'MB'"],
        "stage_order": ["add_meta", "drop_if"]
    }));
    assert!(process(&p, "m value=1 1").is_some());
}

#[test]
fn renames_record_the_old_name_in_meta() {
    let p = processor(json!({
        "rename_messages": {"old_message_name": "new_message_name"},
        "rename_messages_if": {"tag.type == 'socket'": "socket_metric"}
    }));
    let m = process(&p, "old_message_name,type=node value=1 1").unwrap();
    assert_eq!(m.name(), "new_message_name");
    assert_eq!(m.meta["oldname"], "old_message_name");
    let m = process(&p, "power,type=socket value=1 1").unwrap();
    assert_eq!(m.name(), "socket_metric");
    assert_eq!(m.meta["oldname"], "power");
}

#[test]
fn tags_meta_and_fields_are_added_deleted_and_moved_under_conditions() {
    let p = processor(json!({
        "add_tags_if": [{"if": "type == 'node'", "key": "cluster", "value": "fritz"}],
        "delete_tags_if": [{"if": "true", "key": "junk"}],
        "add_meta_if": [{"if": "true", "key": "source", "value": "loadavg"}],
        "delete_meta_if": [{"if": "true", "key": "gone"}],
        "add_field_if": [{"if": "value > 1", "key": "note", "value": "high"}],
        "delete_field_if": [{"if": "true", "key": "extra"}],
        "move_tag_to_meta_if": [{"if": "true", "key": "unit", "value": "unit"}],
        "move_tag_to_field_if": [{"if": "true", "key": "job", "value": "jobid"}],
        "move_meta_to_tag_if": [{"if": "meta.source == 'loadavg'", "key": "source", "value": "collector"}],
        "move_meta_to_field_if": [{"if": "true", "key": "unit", "value": "unit_field"}],
        "move_field_to_tag_if": [{"if": "true", "key": "count", "value": "count"}],
        "move_field_to_meta_if": [{"if": "true", "key": "note", "value": "note"}]
    }));
    let m = process(
        &p,
        "load,type=node,junk=1,unit=load,job=42 value=2,extra=1i,count=7i 1",
    )
    .unwrap();
    let mut tags = m.point.tags.clone();
    tags.sort();
    assert_eq!(
        tags,
        [
            ("cluster".into(), "fritz".into()),
            ("collector".into(), "loadavg".into()),
            ("count".into(), "7".into()),
            ("type".into(), "node".into())
        ]
    );
    use ccfleet::lineproto::OwnedValue::*;
    let mut fields = m.point.fields.clone();
    fields.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(
        fields,
        [
            ("jobid".into(), String("42".into())),
            ("unit_field".into(), String("load".into())),
            ("value".into(), Float(2.0))
        ]
    );
    assert_eq!(m.meta.get("note").map(|s| s.as_str()), Some("high"));
    assert!(!m.meta.contains_key("unit"));
}

#[test]
fn units_of_events_are_left_alone() {
    let p = processor(json!({"normalize_units": true, "change_unit_prefix": {"true": "G"}}));
    let m = process(&p, "job,unit=kB event=\"x\" 1").unwrap();
    assert_eq!(m.tag("unit"), Some("kB"));
    let m = process(&p, "mem,unit=kB value=2000000 1").unwrap();
    assert_eq!(m.tag("unit"), Some("GB"));
}

#[test]
fn an_empty_new_name_is_refused_naming_the_rule() {
    let e = refused(json!({"rename_metrics": {"a": ""}}));
    assert!(
        e.starts_with("router.rename_metrics[\"a\"]: the new name is empty"),
        "{e}"
    );
    let e = refused(json!({"process_messages": {"rename_messages_if": {"true": ""}}}));
    assert!(e.contains("rename_messages_if[\"true\"]"), "{e}");
}

#[test]
fn deleting_a_message_defining_field_is_refused_at_configuration() {
    let config: ProcessorConfig =
        serde_json::from_value(json!({"delete_field_if": [{"if": "true", "key": "value"}]}))
            .unwrap();
    let e = Processor::new(&config, "process_messages").unwrap_err();
    assert!(
        e.contains("delete_field_if[0]") && e.contains("\"value\""),
        "{e}"
    );
}

#[test]
fn drop_by_message_type_drops_events_but_keeps_metrics() {
    let p = processor(json!({"drop_by_message_type": ["event"]}));
    assert_eq!(process(&p, "job_start,type=node event=\"started\" 1"), None);
    assert!(process(&p, "load,type=node value=1 1").is_some());
    let config: ProcessorConfig =
        serde_json::from_value(json!({"drop_by_message_type": ["metrics"]})).unwrap();
    assert!(
        Processor::new(&config, "p")
            .unwrap_err()
            .contains("\"metrics\"")
    );
}

#[test]
fn base_env_constants_are_usable_in_conditions() {
    let p = processor(json!({
        "add_base_env": {"mykey": "socket", "limit": 40},
        "drop_messages_if": ["tag.type == mykey && value > limit"]
    }));
    assert_eq!(process(&p, "temp,type=socket value=50 1"), None);
    assert!(process(&p, "temp,type=socket value=30 1").is_some());
    assert!(process(&p, "temp,type=node value=50 1").is_some());
}

#[test]
fn a_nested_base_env_object_is_refused_naming_it() {
    let config: ProcessorConfig =
        serde_json::from_value(json!({"add_base_env": {"ok": 1, "limits": {"temp": 90}}})).unwrap();
    let e = Processor::new(&config, "process_messages").unwrap_err();
    assert!(
        e.starts_with("process_messages.add_base_env.limits: only numbers"),
        "{e}"
    );
}

#[test]
fn stage_order_takes_stage_names_and_refuses_unknown_ones() {
    // Rename first, then drop by the new name.
    let p = processor(json!({
        "rename_messages": {"a": "b"},
        "drop_messages": ["b"],
        "stage_order": ["rename", "drop_by_name"]
    }));
    assert_eq!(process(&p, "a value=1 1"), None);
    let config: ProcessorConfig =
        serde_json::from_value(json!({"stage_order": ["rename", "explode"]})).unwrap();
    let e = Processor::new(&config, "process_messages").unwrap_err();
    assert!(e.contains("stage_order[1]") && e.contains("explode"), "{e}");
}

#[test]
fn the_documented_syntax_evaluates() {
    let line = "cpu_user,hostname=n1,type=hwthread,type-id=3,stype=core,stype-id=1 value=12.5,extra=\"x\" 1700000000000000000";
    for (cond, want) in [
        ("name == 'cpu_user'", true),
        ("timestamp == 1700000000 && time == 1700000000", true),
        ("type == 'hwthread' and type-id == '3'", true),
        (
            "tag_type == 'hwthread' && tag_type-id == 3 && tag_typeid == 3",
            true,
        ),
        (
            "stype == 'core' && stype-id == 1 && tag_stypeid == '1'",
            true,
        ),
        (
            "tag.typeid == 3 && typeid == 3 && tags['type-id'] == 3 && stypeid == 1",
            true,
        ),
        (
            "tags.hostname == 'n1' && tags_hostname == 'n1' && tag['hostname'] == 'n1'",
            true,
        ),
        (
            "value == 12.5 && field_value > 12 && fields.extra == 'x' && field.value <= 12.5",
            true,
        ),
        ("messagetype == 'metric' && msgtype != 'event'", true),
        ("name matches '^cpu_%w+$'", true),
        ("name matches '^mem'", false),
        ("type-id in [1, 2, 3]", true),
        ("type not in ['node', 'socket']", true),
        ("not (value < 10) || false", true),
        ("!(value >= 13)", true),
        ("(value * 2 + 1) / 2 - 0.5 == 12.5 && 7 % 4 == 3", true),
        ("meta.unit == nil && meta_unit != 'MB'", true),
        (
            "name startsWith 'cpu' && name endsWith 'user' && name contains 'u_u'",
            true,
        ),
        (
            "msg.HasTag('hostname') && !metric.HasTag('cluster') && !msg.HasMeta('unit')",
            true,
        ),
        ("metric.HasField('extra') && len(name) == 8", true),
        ("true", true),
        ("*", true),
        ("missing_tag", false),
    ] {
        assert_eq!(condition(cond, line), want, "{cond}");
    }
}

#[test]
fn unsupported_constructs_are_refused_naming_them_and_the_expression() {
    for (src, names) in [
        (
            "getCpuListOfType('board', 1)",
            "\"board\" is not node, socket",
        ),
        ("getCpuList(1)", "takes 0 argument"),
        ("value ** 2 > 4", "\"**\""),
        ("value > 1 ? true : false", "\"?\" (the conditional"),
        ("now() > 0", "unsupported function now()"),
        // Once an endless loop of empty names: the lexer did not move past a `$`.
        ("$env.name == 'x'", "$env"),
        ("name == $", "$env"),
        ("name[0:2] == 'cp'", "slices"),
        ("tag[name] == 'x'", "literal key"),
        ("name matches tag.pattern", "literal"),
        ("filter(values, 1)", "filter"),
        ("name == 'x' &&", "ends early"),
        ("match('(', name)", "invalid"),
        ("metric.Tags()", "Tags()"),
        ("'unterminated", "not closed"),
        ("", "empty"),
    ] {
        let e = Expr::parse(src, Mode::Condition).unwrap_err();
        let text = e.to_string();
        assert!(text.contains(names), "{src}: {text}");
        assert!(text.contains("expression"), "{src}: {text}");
    }
}

#[test]
fn a_bad_condition_names_its_rule_in_the_configuration_error() {
    let e = refused(json!({"process_messages": {"add_tags_if": [
        {"if": "true", "key": "a", "value": "b"},
        {"if": "name === 'x'", "key": "a", "value": "b"}
    ]}}));
    assert!(
        e.starts_with("router.process_messages.add_tags_if[1]: expression"),
        "{e}"
    );
    let e = refused(json!({"drop_metrics_if": ["now() > 0"]}));
    assert!(e.starts_with("router.drop_metrics_if[0]"), "{e}");
}

#[test]
fn a_condition_failing_on_one_point_drops_that_point_only() {
    let mut r = router(json!({"drop_metrics_if": ["value > 10"]}));
    let out = r.route(
        b"a,hostname=h value=\"text\" 1\nb,hostname=h value=5 1\nc,hostname=h value=50 1\n",
        NOW,
    );
    assert_eq!(
        String::from_utf8(out.lines).unwrap(),
        "b,hostname=h value=5 1\n"
    );
    assert_eq!((out.points, out.dropped, out.failed), (1, 1, 1));
    assert_eq!(r.counters().failed, 1);
}

#[test]
fn the_hostname_tag_is_added_only_where_missing() {
    let mut r = router(json!({"hostname_tag": "host", "drop_metrics": ["x"]}));
    let out = route(&mut r, "a value=1 1\nb,host=other value=1 1\n");
    assert_eq!(out, ["a,host=node01 value=1 1", "b,host=other value=1 1"]);
}

// ---- the parser under hostile input ----

#[test]
fn deep_nesting_is_refused_not_overflowed() {
    for depth in [MAX_DEPTH + 1, 10_000] {
        for (open, close) in [("(", ")"), ("[", "]"), ("!", ""), ("-", ""), ("not ", "")] {
            let src = format!("{}1{}", open.repeat(depth), close.repeat(depth));
            if src.len() > super::expr::MAX_LEN {
                assert!(
                    Expr::parse(&src, Mode::Condition)
                        .unwrap_err()
                        .why
                        .contains("longer")
                );
                continue;
            }
            let e = Expr::parse(&src, Mode::Condition).unwrap_err();
            assert!(e.why.contains("nested deeper"), "{open}: {}", e.why);
        }
    }
    let chain = vec!["true"; 500].join(" || ");
    assert!(chain.len() < super::expr::MAX_LEN);
    assert!(Expr::parse(&chain, Mode::Condition).is_err());
    let ok = format!("{}true{}", "(".repeat(30), ")".repeat(30));
    assert!(Expr::parse(&ok, Mode::Condition).is_ok());
}

#[test]
fn no_input_makes_the_parser_or_evaluator_panic() {
    let pieces = [
        "(",
        ")",
        "[",
        "]",
        "'",
        "\"",
        "\\",
        "%",
        "!",
        "-",
        "+",
        "*",
        "/",
        "==",
        "!=",
        "<",
        ">=",
        "&&",
        "||",
        " and ",
        " or ",
        " not ",
        " in ",
        " matches ",
        "name",
        "tag.",
        "tags_",
        "type-id",
        "meta.x",
        "value",
        "1",
        "1e308",
        "0.5",
        "1e999",
        ",",
        ".",
        "match(",
        "len(",
        "avg(",
        "msg.HasTag(",
        "metric.Name()",
        "é",
        "\u{0}",
        "?",
        "true",
        "nil",
        "values",
        " ",
    ];
    let line = message("m,type=node,type-id=1 value=2,s=\"x\" 1");
    let env = Default::default();
    let topology = topology();
    let scope = MessageScope {
        msg: &line,
        env: &env,
        topology: &topology,
    };
    // A deterministic walk over many combinations (xorshift).
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut parsed = 0;
    for _ in 0..20_000 {
        let mut src = String::new();
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let len = (state % 12) as usize + 1;
        let mut s = state;
        for _ in 0..len {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            src.push_str(pieces[(s >> 33) as usize % pieces.len()]);
        }
        for mode in [Mode::Condition, Mode::Aggregate] {
            if let Ok(e) = Expr::parse(&src, mode) {
                parsed += 1;
                let _ = e.eval(&scope);
            }
        }
    }
    assert!(
        parsed > 100,
        "the walk should reach valid expressions too ({parsed})"
    );
}

const PIECES: [&str; 66] = [
    "'m'",
    "'node'",
    "tag.type",
    "type",
    "meta.unit",
    "msgtype",
    " == ",
    " != ",
    "(",
    ")",
    "[",
    "]",
    "'",
    "\"",
    "\\",
    "%",
    "!",
    "-",
    "+",
    "*",
    "/",
    "==",
    "!=",
    "<",
    ">=",
    "&&",
    "||",
    " and ",
    " or ",
    " not ",
    " in ",
    " matches ",
    "name",
    "tag.",
    "tags_",
    "type-id",
    "meta.x",
    "value",
    "1",
    "1e308",
    "0.5",
    "1e999",
    ",",
    ".",
    "match(",
    "len(",
    "avg(",
    "msg.HasTag(",
    "metric.Name()",
    "é",
    "\u{0}",
    "?",
    "true",
    "nil",
    "values",
    " ",
    "getCpuListOfType(",
    "getCpuList()",
    "getCpuCore(",
    "'socket'",
    "'node'",
    "-1",
    "9007199254740993",
    "s",
    "x",
    "contains",
];

const VARS: [&str; 12] = [
    "name",
    "type",
    "tag.type",
    "tags['type-id']",
    "meta.unit",
    "msgtype",
    "messagetype",
    "tag.missing",
    "value",
    "s",
    "field.s",
    "hostname",
];
const LITERALS: [&str; 7] = ["m", "node", "", "2", "x", "^m$", "metric"];

/// A scope without [`Scope::text`], so every variable takes the general path.
struct NoText<'a>(&'a MessageScope<'a>);

impl Scope for NoText<'_> {
    fn get(&self, var: &Var) -> Value {
        self.0.get(var)
    }
    fn has(&self, place: Place, key: &str) -> bool {
        self.0.has(place, key)
    }
    fn topology(&self) -> Option<&Topology> {
        self.0.topology()
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(2000))]

    /// Any expression from pieces of the language, over any message: parsing gives an
    /// expression or an error, evaluation a value or an error, never a panic.
    #[test]
    fn arbitrary_expressions_over_arbitrary_messages_never_panic(
        pieces in proptest::collection::vec(0..PIECES.len(), 1..14),
        raw in "\\PC{0,30}",
        tags in proptest::collection::vec(("type|type-id|hostname|[a-z_-]{1,6}", "node|2|m|\\PC{1,8}"), 0..4),
        value in proptest::prelude::any::<f64>(),
        text in "\\PC{0,10}",
        comparisons in proptest::collection::vec((0..VARS.len(), 0..4usize, 0..LITERALS.len()), 1..4),
    ) {
        let src: String = pieces.iter().map(|&i| PIECES[i]).collect();
        // Comparisons of the common form, `tag.type == 'node' && name matches 'm'`.
        let compared = comparisons
            .iter()
            .map(|&(v, op, lit)| {
                let op = ["==", "!=", "matches", "<"][op];
                format!("{} {op} '{}'", VARS[v], LITERALS[lit])
            })
            .collect::<Vec<_>>()
            .join(" && ");
        let mut point = ccfleet::lineproto::Point {
            measurement: "m".to_owned(),
            tags,
            fields: vec![
                ("value".to_owned(), ccfleet::lineproto::OwnedValue::Float(value)),
                ("s".to_owned(), ccfleet::lineproto::OwnedValue::String(text)),
            ],
            time: Some(1),
        };
        point.tags.sort();
        point.tags.dedup_by(|a, b| a.0 == b.0);
        let msg = Message::new(point);
        let env = Default::default();
        let topology = topology();
        let scope = MessageScope { msg: &msg, env: &env, topology: &topology };
        for src in [src.as_str(), raw.as_str(), compared.as_str()] {
            for mode in [Mode::Condition, Mode::Aggregate] {
                if let Ok(e) = Expr::parse(src, mode) {
                    let fast = e.eval(&scope);
                    // The borrowed-text shortcut gives what the general path gives.
                    let general = e.eval(&NoText(&scope));
                    proptest::prop_assert_eq!(format!("{fast:?}"), format!("{general:?}"), "{}", src);
                    let _ = e.eval_bool(&scope);
                }
            }
        }
    }

    /// Any batch, valid or not, through a router with every kind of rule: the router
    /// gives each point a fate (sent, dropped or failed) and goes on.
    #[test]
    fn arbitrary_batches_never_stop_the_router(
        lines in proptest::collection::vec(
            ("[a-z_]{1,8}", proptest::collection::vec(("[a-z-]{1,5}", "[a-zA-Z0-9%]{1,5}"), 0..3),
             proptest::prelude::any::<i32>(), proptest::prelude::any::<bool>()),
            0..12),
        garbage in "\\PC{0,40}",
    ) {
        let mut r = router(json!({
            "num_cache_intervals": 1,
            "interval_timestamp": true,
            "interval_aggregates": [{"name": "agg", "if": "value > 0", "function": "sum(values) / count(values)"}],
            "process_messages": {
                "drop_messages_if": ["type-id in getCpuListOfType('socket', 1)", "value > 1000"],
                "add_tags_if": [{"if": "value < 0", "key": "neg", "value": "yes"}],
                "move_tag_to_field_if": [{"if": "true", "key": "a", "value": "a"}],
                "move_field_to_tag_if": [{"if": "msg.HasField('b')", "key": "b", "value": "b"}],
                "rename_messages_if": {"name matches '^x'": "renamed"},
                "change_unit_prefix": {"true": "K"},
                "normalize_units": true
            }
        }));
        let mut batch = String::new();
        for (name, tags, value, as_text) in &lines {
            batch.push_str(name);
            for (k, v) in tags {
                batch.push_str(&format!(",{k}={v}"));
            }
            if *as_text {
                batch.push_str(&format!(" value=\"{value}\" 1\n"));
            } else {
                batch.push_str(&format!(" value={value}i 1\n"));
            }
        }
        batch.push_str(&garbage);
        let out = r.route(batch.as_bytes(), NOW);
        let text = String::from_utf8(out.lines).unwrap();
        proptest::prop_assert_eq!(text.lines().count(), out.points);
        let counters = r.counters();
        proptest::prop_assert_eq!(
            counters.points_in as usize,
            out.points + out.dropped + out.failed
        );
        let _ = r.flush(NOW + 10_000_000_000);
    }
}
