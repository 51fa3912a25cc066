package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/envoyproxy/go-control-plane/envoy/annotations"
	validate "github.com/envoyproxy/protoc-gen-validate/validate"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"

	// The messages the table starts from: the bootstrap, and the types KKP's
	// envoy-agent template packs into an Any.
	_ "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/tcp_proxy/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
)

// Roots are the messages whose closure the table holds.
var Roots = []protoreflect.FullName{
	"envoy.config.bootstrap.v3.Bootstrap",
	"envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy",
	"envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
	"envoy.extensions.filters.http.router.v3.Router",
	"envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
}

// Module is the go-control-plane module the table is generated from; the
// drift test checks it against go.mod's requirement.
const Module = "github.com/envoyproxy/go-control-plane/envoy"

type schema struct {
	messages []protoreflect.MessageDescriptor
	msgIndex map[protoreflect.FullName]int
	enums    []protoreflect.EnumDescriptor
	enumIdx  map[protoreflect.FullName]int
	// Rule kinds the table carries as Unsupported (not enforced), counted.
	unsupported map[string]int
}

func collect() (*schema, error) {
	s := &schema{
		msgIndex:    map[protoreflect.FullName]int{},
		enumIdx:     map[protoreflect.FullName]int{},
		unsupported: map[string]int{},
	}
	seen := map[protoreflect.FullName]protoreflect.MessageDescriptor{}
	enums := map[protoreflect.FullName]protoreflect.EnumDescriptor{}
	var walk func(md protoreflect.MessageDescriptor)
	walk = func(md protoreflect.MessageDescriptor) {
		if _, ok := seen[md.FullName()]; ok {
			return
		}
		seen[md.FullName()] = md
		fs := md.Fields()
		for i := 0; i < fs.Len(); i++ {
			f := fs.Get(i)
			if f.IsMap() {
				f = f.MapValue()
			}
			if f.Enum() != nil {
				enums[f.Enum().FullName()] = f.Enum()
			}
			if f.Message() != nil {
				walk(f.Message())
			}
		}
	}
	for _, r := range Roots {
		d, err := protoregistry.GlobalFiles.FindDescriptorByName(r)
		if err != nil {
			return nil, fmt.Errorf("root %s: %w", r, err)
		}
		walk(d.(protoreflect.MessageDescriptor))
	}
	for _, md := range seen {
		s.messages = append(s.messages, md)
	}
	sort.Slice(s.messages, func(i, j int) bool { return s.messages[i].FullName() < s.messages[j].FullName() })
	for i, md := range s.messages {
		s.msgIndex[md.FullName()] = i
	}
	for _, e := range enums {
		s.enums = append(s.enums, e)
	}
	sort.Slice(s.enums, func(i, j int) bool { return s.enums[i].FullName() < s.enums[j].FullName() })
	for i, e := range s.enums {
		s.enumIdx[e.FullName()] = i
	}
	return s, nil
}

func (s *schema) kind(f protoreflect.FieldDescriptor) string {
	switch f.Kind() {
	case protoreflect.BoolKind:
		return "Kind::Bool"
	case protoreflect.StringKind:
		return "Kind::Str"
	case protoreflect.BytesKind:
		return "Kind::Bytes"
	case protoreflect.Int32Kind, protoreflect.Sint32Kind, protoreflect.Sfixed32Kind:
		return "Kind::I32"
	case protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind:
		return "Kind::I64"
	case protoreflect.Uint32Kind, protoreflect.Fixed32Kind:
		return "Kind::U32"
	case protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
		return "Kind::U64"
	case protoreflect.FloatKind:
		return "Kind::F32"
	case protoreflect.DoubleKind:
		return "Kind::F64"
	case protoreflect.EnumKind:
		return fmt.Sprintf("Kind::Enum(%d)", s.enumIdx[f.Enum().FullName()])
	case protoreflect.MessageKind, protoreflect.GroupKind:
		return fmt.Sprintf("Kind::Msg(%d)", s.msgIndex[f.Message().FullName()])
	}
	return "Kind::Str"
}

func rustStr(v string) string {
	var b strings.Builder
	b.WriteByte('"')
	for _, r := range v {
		switch {
		case r == '"' || r == '\\':
			b.WriteByte('\\')
			b.WriteRune(r)
		case r < 0x20 || r == 0x7f:
			fmt.Fprintf(&b, "\\u{%x}", r)
		default:
			b.WriteRune(r)
		}
	}
	b.WriteByte('"')
	return b.String()
}

func num(v any) (float64, bool) {
	switch x := v.(type) {
	case float64:
		return x, true
	case string:
		f, err := strconv.ParseFloat(x, 64)
		return f, err == nil
	}
	return 0, false
}

func rustF64(f float64) string {
	if f == math.Trunc(f) && math.Abs(f) < 1e18 {
		return strconv.FormatFloat(f, 'f', 1, 64)
	}
	return strconv.FormatFloat(f, 'g', -1, 64)
}

func durationArgs(v any) (string, bool) {
	str, ok := v.(string)
	if !ok {
		return "", false
	}
	d, err := time.ParseDuration(str)
	if err != nil || d < 0 {
		return "", false
	}
	return fmt.Sprintf("%d, %d", int64(d/time.Second), int64(d%time.Second)), true
}

func strList(v any) (string, bool) {
	l, ok := v.([]any)
	if !ok {
		return "", false
	}
	var out []string
	for _, x := range l {
		str, ok := x.(string)
		if !ok {
			return "", false
		}
		out = append(out, rustStr(str))
	}
	return "&[" + strings.Join(out, ", ") + "]", true
}

// rules translates PGV rules (as protojson renders them) into the table's
// Rule variants; what it cannot express becomes Unsupported, named.
func (s *schema) rules(m map[string]any) []string {
	var out []string
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, kind := range keys {
		inner, ok := m[kind].(map[string]any)
		if !ok {
			s.unsupported[kind]++
			out = append(out, fmt.Sprintf("Rule::Unsupported(%s)", rustStr(kind)))
			continue
		}
		ik := make([]string, 0, len(inner))
		for k := range inner {
			ik = append(ik, k)
		}
		sort.Strings(ik)
		strict := true
		if v, ok := inner["strict"].(bool); ok {
			strict = v
		}
		for _, k := range ik {
			v := inner[k]
			r := ""
			switch kind + "." + k {
			case "message.required", "duration.required", "any.required", "timestamp.required":
				if b, _ := v.(bool); b {
					r = "Rule::Required"
				}
			case "message.skip":
				if b, _ := v.(bool); b {
					r = "Rule::Skip"
				}
			case "duration.gt", "duration.gte", "duration.lt", "duration.lte":
				if a, ok := durationArgs(v); ok {
					r = fmt.Sprintf("Rule::Duration%s(%s)", strings.ToUpper(k[:1])+k[1:], a)
				}
			case "string.ignoreEmpty", "bytes.ignoreEmpty", "repeated.ignoreEmpty", "map.ignoreEmpty",
				"uint32.ignoreEmpty", "uint64.ignoreEmpty", "int32.ignoreEmpty", "int64.ignoreEmpty", "double.ignoreEmpty":
				if b, _ := v.(bool); b {
					r = "Rule::IgnoreEmpty"
				}
			case "string.strict":
				continue
			case "string.minLen", "string.maxLen", "string.minBytes", "string.maxBytes", "string.len",
				"bytes.minLen", "bytes.maxLen", "bytes.len",
				"repeated.minItems", "repeated.maxItems", "map.minPairs", "map.maxPairs":
				if n, ok := num(v); ok {
					name := map[string]string{
						"minLen": "MinLen", "maxLen": "MaxLen", "minBytes": "MinBytes", "maxBytes": "MaxBytes",
						"len": "Len", "minItems": "MinItems", "maxItems": "MaxItems", "minPairs": "MinItems", "maxPairs": "MaxItems",
					}[k]
					if kind == "bytes" && (k == "minLen" || k == "maxLen" || k == "len") {
						name = map[string]string{"minLen": "MinBytes", "maxLen": "MaxBytes", "len": "LenBytes"}[k]
					}
					r = fmt.Sprintf("Rule::%s(%d)", name, uint64(n))
				}
			case "string.in":
				if l, ok := strList(v); ok {
					r = "Rule::In(" + l + ")"
				}
			case "string.notIn":
				if l, ok := strList(v); ok {
					r = "Rule::NotIn(" + l + ")"
				}
			case "string.prefix", "string.suffix", "string.contains", "string.pattern":
				if str, ok := v.(string); ok {
					r = fmt.Sprintf("Rule::%s(%s)", strings.ToUpper(k[:1])+k[1:], rustStr(str))
				}
			case "string.const":
				if str, ok := v.(string); ok {
					r = fmt.Sprintf("Rule::StrConst(%s)", rustStr(str))
				}
			case "string.wellKnownRegex":
				switch v {
				case "HTTP_HEADER_NAME":
					r = fmt.Sprintf("Rule::HeaderName { strict: %v }", strict)
				case "HTTP_HEADER_VALUE":
					r = fmt.Sprintf("Rule::HeaderValue { strict: %v }", strict)
				}
			case "uint32.gt", "uint32.gte", "uint32.lt", "uint32.lte", "uint64.gt", "uint64.gte", "uint64.lt", "uint64.lte",
				"int32.gt", "int32.gte", "int32.lt", "int32.lte", "int64.gt", "int64.gte", "int64.lt", "int64.lte",
				"double.gt", "double.gte", "double.lt", "double.lte", "float.gt", "float.gte", "float.lt", "float.lte":
				if n, ok := num(v); ok {
					r = fmt.Sprintf("Rule::%s(%s)", strings.ToUpper(k[:1])+k[1:], rustF64(n))
				}
			case "uint32.const", "uint64.const", "int32.const", "int64.const", "double.const":
				if n, ok := num(v); ok {
					r = fmt.Sprintf("Rule::NumConst(%s)", rustF64(n))
				}
			case "bool.const":
				if b, ok := v.(bool); ok {
					r = fmt.Sprintf("Rule::BoolConst(%v)", b)
				}
			case "enum.definedOnly":
				if b, _ := v.(bool); b {
					r = "Rule::DefinedOnly"
				}
			case "enum.notIn", "enum.in":
				if l, ok := v.([]any); ok {
					var ns []string
					for _, x := range l {
						if n, ok := num(x); ok {
							ns = append(ns, strconv.FormatInt(int64(n), 10))
						}
					}
					name := map[string]string{"notIn": "EnumNotIn", "in": "EnumIn"}[k]
					r = fmt.Sprintf("Rule::%s(&[%s])", name, strings.Join(ns, ", "))
				}
			case "repeated.unique":
				if b, _ := v.(bool); b {
					r = "Rule::Unique"
				}
			case "repeated.items", "map.keys", "map.values":
				if sub, ok := v.(map[string]any); ok {
					name := map[string]string{"items": "Items", "keys": "Keys", "values": "Values"}[k]
					r = fmt.Sprintf("Rule::%s(&[%s])", name, strings.Join(s.rules(sub), ", "))
				}
			case "any.in":
				if l, ok := strList(v); ok {
					r = "Rule::AnyIn(" + l + ")"
				}
			}
			if b, ok := v.(bool); ok && !b && r == "" {
				// A boolean rule set to false asks for nothing.
				continue
			}
			if r == "" {
				s.unsupported[kind+"."+k]++
				r = fmt.Sprintf("Rule::Unsupported(%s)", rustStr(kind+"."+k))
			}
			out = append(out, r)
		}
	}
	return out
}

func (s *schema) fieldRules(f protoreflect.FieldDescriptor) []string {
	r, _ := proto.GetExtension(f.Options(), validate.E_Rules).(*validate.FieldRules)
	if r == nil {
		return nil
	}
	b, err := protojson.Marshal(r)
	if err != nil {
		return []string{`Rule::Unsupported("unreadable")`}
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		return []string{`Rule::Unsupported("unreadable")`}
	}
	return s.rules(m)
}

// Generate renders the Rust table.
func Generate(version string) ([]byte, map[string]int, error) {
	s, err := collect()
	if err != nil {
		return nil, nil, err
	}
	var b bytes.Buffer
	fmt.Fprintf(&b, "// @generated by tests/envoyschema (`go run -C tests/envoyschema . -write`) from\n")
	fmt.Fprintf(&b, "// %s %s; do not edit. Its drift test fails when this file\n", Module, version)
	fmt.Fprintf(&b, "// is not what that module gives.\n\n")
	fmt.Fprintf(&b, "//! Envoy's v3 bootstrap schema as go-control-plane carries it: every message\n")
	fmt.Fprintf(&b, "//! the bootstrap and the typed configs of KKP's envoy-agent template reach,\n")
	fmt.Fprintf(&b, "//! with their fields, enums, oneofs, deprecation and PGV rules.\n\n")
	fmt.Fprintf(&b, "use crate::schema_types::{Card, Enum, Field, Kind, Message, Rule};\n\n")
	fmt.Fprintf(&b, "/// The module and version the table was generated from.\n")
	fmt.Fprintf(&b, "pub const SOURCE: &str = %s;\n\n", rustStr(Module+" "+version))
	fmt.Fprintf(&b, "/// Indices into [`MESSAGES`] of the roots.\n")
	var roots []string
	for _, r := range Roots {
		roots = append(roots, fmt.Sprintf("(%s, %d)", rustStr(string(r)), s.msgIndex[r]))
	}
	fmt.Fprintf(&b, "pub static ROOTS: &[(&str, u16)] = &[%s];\n\n", strings.Join(roots, ", "))
	fmt.Fprintf(&b, "pub static MESSAGES: &[Message] = &[\n")
	for i, md := range s.messages {
		fmt.Fprintf(&b, "    // %d\n    Message {\n        name: %s,\n", i, rustStr(string(md.FullName())))
		// Real oneofs (not proto3 optional's synthetic ones), in order.
		var oneofs []string
		oneofIdx := map[protoreflect.FullName]int{}
		for j := 0; j < md.Oneofs().Len(); j++ {
			o := md.Oneofs().Get(j)
			if o.IsSynthetic() {
				continue
			}
			req, _ := proto.GetExtension(o.Options(), validate.E_Required).(bool)
			oneofIdx[o.FullName()] = len(oneofs)
			oneofs = append(oneofs, fmt.Sprintf("(%s, %v)", rustStr(string(o.Name())), req))
		}
		fmt.Fprintf(&b, "        oneofs: &[%s],\n", strings.Join(oneofs, ", "))
		disabled, _ := proto.GetExtension(md.Options(), validate.E_Disabled).(bool)
		ignored, _ := proto.GetExtension(md.Options(), validate.E_Ignored).(bool)
		fmt.Fprintf(&b, "        pgv: %v,\n", !disabled && !ignored)
		fmt.Fprintf(&b, "        fields: &[\n")
		fs := md.Fields()
		for j := 0; j < fs.Len(); j++ {
			f := fs.Get(j)
			card := "Card::One"
			vf := f
			if f.IsMap() {
				card = fmt.Sprintf("Card::Map(%s)", s.kind(f.MapKey()))
				vf = f.MapValue()
			} else if f.IsList() {
				card = "Card::Many"
			}
			oneof := "None"
			if o := f.ContainingOneof(); o != nil && !o.IsSynthetic() {
				oneof = fmt.Sprintf("Some(%d)", oneofIdx[o.FullName()])
			}
			opts, _ := f.Options().(*descriptorpb.FieldOptions)
			deprecated := opts.GetDeprecated()
			disallowed, _ := proto.GetExtension(f.Options(), annotations.E_DisallowedByDefault).(bool)
			fmt.Fprintf(&b, "            Field { name: %s, json: %s, kind: %s, card: %s, oneof: %s, deprecated: %v, disallowed: %v, rules: &[%s] },\n",
				rustStr(string(f.Name())), rustStr(f.JSONName()), s.kind(vf), card, oneof, deprecated, disallowed && deprecated,
				strings.Join(s.fieldRules(f), ", "))
		}
		fmt.Fprintf(&b, "        ],\n    },\n")
	}
	fmt.Fprintf(&b, "];\n\n")
	fmt.Fprintf(&b, "pub static ENUMS: &[Enum] = &[\n")
	for _, e := range s.enums {
		var vs []string
		for j := 0; j < e.Values().Len(); j++ {
			v := e.Values().Get(j)
			vs = append(vs, fmt.Sprintf("(%s, %d)", rustStr(string(v.Name())), v.Number()))
		}
		fmt.Fprintf(&b, "    Enum { name: %s, values: &[%s] },\n", rustStr(string(e.FullName())), strings.Join(vs, ", "))
	}
	fmt.Fprintf(&b, "];\n")
	return b.Bytes(), s.unsupported, nil
}
