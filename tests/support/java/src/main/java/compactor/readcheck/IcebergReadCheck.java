package compactor.readcheck;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.BufferedReader;
import java.io.File;
import java.io.FileDescriptor;
import java.io.FileOutputStream;
import java.io.IOException;
import java.io.InputStreamReader;
import java.io.PrintStream;
import java.io.PrintWriter;
import java.io.StringWriter;
import java.math.BigDecimal;
import java.math.MathContext;
import java.math.RoundingMode;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.time.LocalDate;
import java.time.LocalDateTime;
import java.time.LocalTime;
import java.time.OffsetDateTime;
import java.time.ZoneOffset;
import java.util.ArrayList;
import java.util.HashSet;
import java.util.HexFormat;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.Set;
import java.util.TreeMap;
import org.apache.iceberg.BaseTable;
import org.apache.iceberg.ContentFile;
import org.apache.iceberg.Files;
import org.apache.iceberg.ManifestContent;
import org.apache.iceberg.ManifestEntries;
import org.apache.iceberg.ManifestFile;
import org.apache.iceberg.ManifestFiles;
import org.apache.iceberg.ManifestReader;
import org.apache.iceberg.MetadataColumns;
import org.apache.iceberg.PartitionSpec;
import org.apache.iceberg.Schema;
import org.apache.iceberg.Snapshot;
import org.apache.iceberg.SnapshotRef;
import org.apache.iceberg.StaticTableOperations;
import org.apache.iceberg.StructLike;
import org.apache.iceberg.Table;
import org.apache.iceberg.aws.s3.S3FileIO;
import org.apache.iceberg.aws.s3.S3FileIOProperties;
import org.apache.iceberg.data.IcebergGenerics;
import org.apache.iceberg.data.Record;
import org.apache.iceberg.data.RefScans;
import org.apache.iceberg.io.CloseableIterable;
import org.apache.iceberg.io.FileIO;
import org.apache.iceberg.io.InputFile;
import org.apache.iceberg.io.OutputFile;
import org.apache.iceberg.types.Conversions;
import org.apache.iceberg.types.Type;
import org.apache.iceberg.types.Types;

/**
 * Reads an Iceberg table with Apache Iceberg's Java library and prints what it sees as JSON.
 *
 * <p>Usage: {@code IcebergReadCheck <metadata.json location> [snapshot id ...]}, or {@code
 * IcebergReadCheck --serve} for many reads in one JVM (see {@link #serve}). Tables on local disk
 * ({@code file:} URIs, plain paths) are read with a local FileIO, tables on S3 ({@code s3://},
 * {@code s3a://}, {@code s3n://}) with Iceberg's S3FileIO, configured by the request's FileIO
 * properties (see {@link #fileIO}). For the current table
 * state, every snapshot in the metadata (time travel) and every branch and tag, all live rows are
 * read with
 * {@code IcebergGenerics} (Java's own delete semantics). Every manifest list and every entry of
 * every manifest, deleted entries included, is read and each file's fields are materialised, so a
 * manifest Java cannot decode fails the run. Exits 1 with the exception on stderr on any failure.
 *
 * <p>Rows are printed in a canonical text form that tests/java_reader.py reproduces from pyarrow:
 * a JSON array of the top-level values; see {@link #canon}.
 *
 * <p>Row lineage (format v3): the current state and every snapshot read is read with the
 * projection {@link MetadataColumns#schemaWithRowLineage} of its schema, so Iceberg's generic
 * readers report each live row's {@code _row_id} and {@code _last_updated_sequence_number} as
 * Java computes them: the file's value where not null, else inherited, the data file's
 * first_row_id plus the row's position in the file, and the data file's <em>file</em> sequence
 * number (what {@code PartitionUtil.constantsMap} hands the readers); both null, whatever the file
 * holds, when the data file has no first_row_id. They are printed as "lineage", one [row id,
 * sequence number] pair per entry of "rows", in the same order. Refs are read without lineage.
 */
public final class IcebergReadCheck {
  private static final HexFormat HEX = HexFormat.of();

  private IcebergReadCheck() {}

  public static void main(String[] args) {
    if (args.length == 1 && args[0].equals("--serve")) {
      serve();
      return;
    }
    if (args.length < 1) {
      System.err.println("usage: IcebergReadCheck <metadata.json location> [snapshot id ...]");
      System.err.println("       IcebergReadCheck --serve   (one JSON request a line on stdin)");
      System.exit(2);
    }
    String json;
    try {
      Set<Long> selected = null;
      if (args.length > 1) {
        selected = new HashSet<>();
        for (int i = 1; i < args.length; i++) {
          selected.add(Long.parseLong(args[i]));
        }
      }
      // S3: the AWS SDK's default configuration; lineage for format v3 tables.
      json = run(args[0], selected, Map.of(), null);
    } catch (Throwable e) {
      System.err.print(failure(e));
      System.exit(1);
      return;
    }
    PrintStream out = new PrintStream(System.out, false, StandardCharsets.UTF_8);
    out.println(json);
    out.flush();
  }

  /**
   * Serves reads until stdin closes: each request is one line of JSON, {@code
   * {"metadata_location": "...", "snapshot_ids": null | [id, ...], "io": {name: value, ...},
   * "lineage": null | true | false}} ("io": Iceberg Java FileIO properties for S3, optional;
   * "lineage": read row lineage, optional, default (null) for format v3 tables only), each
   * answer one line, {@code {"ok": true, "result": <the document main prints>}} or {@code {"ok":
   * false, "error": "<what main prints on stderr>"}}, credentials in it redacted. A failed read answers with its error
   * and the server goes on. The protocol owns stdout: anything else printing there is sent to
   * stderr.
   */
  static void serve() {
    PrintStream protocol =
        new PrintStream(new FileOutputStream(FileDescriptor.out), false, StandardCharsets.UTF_8);
    System.setOut(System.err);
    ObjectMapper mapper = new ObjectMapper();
    try (BufferedReader in =
        new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8))) {
      for (String line = in.readLine(); line != null; line = in.readLine()) {
        if (line.isBlank()) {
          continue;
        }
        String answer;
        Map<String, String> io = new TreeMap<>();
        try {
          JsonNode request = mapper.readTree(line);
          JsonNode properties = request.get("io");
          if (properties != null && properties.isObject()) {
            properties.properties().forEach(p -> io.put(p.getKey(), p.getValue().asText()));
          }
          JsonNode ids = request.get("snapshot_ids");
          Set<Long> selected = null;
          if (ids != null && !ids.isNull()) {
            selected = new HashSet<>();
            for (JsonNode id : ids) {
              selected.add(id.asLong());
            }
          }
          JsonNode lineage = request.get("lineage");
          Boolean withLineage =
              lineage == null || lineage.isNull() ? null : Boolean.valueOf(lineage.asBoolean());
          answer = "{\"ok\":true,\"result\":"
              + run(request.get("metadata_location").asText(), selected, io, withLineage) + "}";
        } catch (Throwable e) {
          StringBuilder error = new StringBuilder("{\"ok\":false,\"error\":");
          Json.quote(error, redact(failure(e), io));
          answer = error.append('}').toString();
        }
        protocol.println(answer);
        protocol.flush();
        if (protocol.checkError()) {
          return; // the client is gone
        }
      }
    } catch (IOException e) {
      System.err.println("IcebergReadCheck server: reading stdin: " + e);
      System.exit(1);
    }
  }

  /** The failure report: the exception, its causes, then its stack trace. */
  private static String failure(Throwable e) {
    StringWriter text = new StringWriter();
    PrintWriter writer = new PrintWriter(text);
    writer.println("IcebergReadCheck failed: " + e);
    for (Throwable cause = e.getCause(); cause != null; cause = cause.getCause()) {
      writer.println("caused by: " + cause);
    }
    e.printStackTrace(writer);
    writer.flush();
    return text.toString();
  }

  /** FileIO properties whose values are credentials: never in an error or a log. */
  private static final List<String> SECRET_PROPERTIES =
      List.of(
          S3FileIOProperties.ACCESS_KEY_ID,
          S3FileIOProperties.SECRET_ACCESS_KEY,
          S3FileIOProperties.SESSION_TOKEN);

  /** {@code text} with every credential value of {@code io} replaced. */
  static String redact(String text, Map<String, String> io) {
    for (String name : SECRET_PROPERTIES) {
      String value = io.get(name);
      if (value != null && !value.isEmpty()) {
        text = text.replace(value, "<redacted " + name + ">");
      }
    }
    return text;
  }

  /**
   * S3FileIOs by their properties, most recently used last: one S3 client serves every read of
   * a table store (building one costs more than a small read). At most four are kept open.
   */
  private static final Map<Map<String, String>, S3FileIO> S3_IOS =
      new LinkedHashMap<>(8, 0.75f, true) {
        @Override
        protected boolean removeEldestEntry(Map.Entry<Map<String, String>, S3FileIO> eldest) {
          if (size() > 4) {
            eldest.getValue().close();
            return true;
          }
          return false;
        }
      };

  /**
   * The FileIO for a table whose metadata.json is at {@code location}: S3FileIO for s3://,
   * s3a:// and s3n:// (Iceberg Java's property names: s3.endpoint, s3.path-style-access,
   * s3.access-key-id, s3.secret-access-key, s3.session-token, client.region; what is not given
   * comes from the AWS SDK's defaults), else the local filesystem.
   */
  static FileIO fileIO(String location, Map<String, String> properties) {
    int colon = location.indexOf("://");
    String scheme = colon < 0 ? "" : location.substring(0, colon).toLowerCase(Locale.ROOT);
    if (!scheme.equals("s3") && !scheme.equals("s3a") && !scheme.equals("s3n")) {
      return new LocalFileIO();
    }
    return S3_IOS.computeIfAbsent(
        Map.copyOf(properties),
        props -> {
          S3FileIO io = new S3FileIO();
          io.initialize(props);
          return io;
        });
  }

  /**
   * Reads the table at {@code metadataLocation} through {@link #fileIO}: every manifest list and
   * manifest, and the rows of the current state and of the snapshots in {@code selected} (all
   * when null) and the refs pointing at them. {@code lineage}: whether the current state and the
   * snapshots are read with their row lineage (null: when the table is format v3 or later).
   */
  static String run(
      String metadataLocation, Set<Long> selected, Map<String, String> properties, Boolean lineage)
      throws IOException {
    FileIO io = fileIO(metadataLocation, properties);
    Table table = new BaseTable(new StaticTableOperations(metadataLocation, io), "checked");
    Map<Integer, PartitionSpec> specs = table.specs();

    // Metadata first: every manifest list and every manifest, read in full.
    Map<Long, List<ManifestFile>> listed = new LinkedHashMap<>();
    Map<String, ManifestInfo> manifests = new LinkedHashMap<>();
    for (Snapshot snapshot : table.snapshots()) {
      long id = snapshot.snapshotId();
      List<ManifestFile> files;
      try {
        files = snapshot.allManifests(io);
      } catch (RuntimeException e) {
        throw new IllegalStateException(
            "snapshot " + id + ": reading manifest list " + snapshot.manifestListLocation()
                + ": " + e,
            e);
      }
      listed.put(id, files);
      for (ManifestFile manifest : files) {
        manifests
            .computeIfAbsent(manifest.path(), path -> readManifest(table, manifest, specs, io))
            .snapshots
            .add(id);
      }
    }

    // Then rows: the current state, every snapshot, every ref.
    Json out = new Json().begin('{');
    int formatVersion = formatVersion(table);
    boolean withLineage = lineage == null ? formatVersion >= 3 : lineage;
    out.key("format_version").raw(Integer.toString(formatVersion));
    Snapshot current = table.currentSnapshot();
    out.key("current_snapshot_id")
        .raw(current == null ? "null" : Long.toString(current.snapshotId()));
    if (formatVersion >= 3) {
      out.key("next_row_id")
          .raw(Long.toString(((BaseTable) table).operations().current().nextRowId()));
    }

    out.key("current").begin('{');
    IcebergGenerics.ScanBuilder currentScan = IcebergGenerics.read(table);
    if (withLineage) {
      currentScan = currentScan.project(MetadataColumns.schemaWithRowLineage(table.schema()));
    }
    readRows(out, table.schema(), "current table state", currentScan.build(), withLineage);
    out.end('}');

    out.key("snapshots").begin('{');
    for (Snapshot snapshot : table.snapshots()) {
      long id = snapshot.snapshotId();
      out.key(Long.toString(id)).begin('{');
      out.key("parent_id")
          .raw(snapshot.parentId() == null ? "null" : snapshot.parentId().toString());
      out.key("schema_id").raw(String.valueOf(snapshot.schemaId()));
      out.key("manifest_list").string(snapshot.manifestListLocation());
      out.key("manifests").begin('[');
      listed.get(id).forEach(manifest -> out.string(manifest.path()));
      out.end(']');
      out.key("sequence_number").raw(Long.toString(snapshot.sequenceNumber()));
      if (selected == null || selected.contains(id)) {
        Schema schema = schemaOf(table, snapshot);
        IcebergGenerics.ScanBuilder scan = IcebergGenerics.read(table).useSnapshot(id);
        if (withLineage) {
          scan = scan.project(MetadataColumns.schemaWithRowLineage(schema));
        }
        readRows(out, schema, "snapshot " + id, scan.build(), withLineage);
      }
      out.end('}');
    }
    out.end('}');

    out.key("refs").begin('{');
    for (Map.Entry<String, SnapshotRef> ref : new TreeMap<>(table.refs()).entrySet()) {
      out.key(ref.getKey()).begin('{');
      out.key("type").string(ref.getValue().isBranch() ? "branch" : "tag");
      out.key("snapshot_id").raw(Long.toString(ref.getValue().snapshotId()));
      if (selected != null && !selected.contains(ref.getValue().snapshotId())) {
        out.end('}');
        continue;
      }
      Schema schema =
          ref.getValue().isBranch()
              ? table.schema()
              : schemaOf(table, table.snapshot(ref.getValue().snapshotId()));
      readRows(out, schema, "ref " + ref.getKey(), RefScans.read(table, ref.getKey()), false);
      out.end('}');
    }
    out.end('}');

    out.key("manifests").begin('[');
    for (ManifestInfo info : manifests.values()) {
      info.write(out);
    }
    out.end(']');
    return out.end('}').toString();
  }

  /** The schema a snapshot was written with (the table's for old snapshots without one). */
  private static Schema schemaOf(Table table, Snapshot snapshot) {
    Integer id = snapshot.schemaId();
    Schema schema = id == null ? null : table.schemas().get(id);
    return schema == null ? table.schema() : schema;
  }

  private static int formatVersion(Table table) {
    return ((BaseTable) table).operations().current().formatVersion();
  }

  /** The row lineage columns, matched by field id in the records of a lineage read. */
  private static final Types.StructType LINEAGE =
      Types.StructType.of(MetadataColumns.ROW_ID, MetadataColumns.LAST_UPDATED_SEQUENCE_NUMBER);

  /**
   * Writes "columns", "row_count" and "rows" for one read, and with {@code lineage} (the records
   * carry the row lineage columns) "lineage": each row's [_row_id, _last_updated_sequence_number]
   * (null when Java gives none), in the order of "rows". {@code what} names the read in errors.
   */
  private static void readRows(
      Json out, Schema schema, String what, CloseableIterable<Record> rows, boolean lineage)
      throws IOException {
    List<String> canonical = new ArrayList<>();
    List<String> lineages = lineage ? new ArrayList<>() : null;
    Types.StructType struct = schema.asStruct();
    Types.StructType positionsFor = null;
    int[] positions = null;
    int[] lineagePositions = null;
    try (CloseableIterable<Record> records = rows) {
      for (Record record : records) {
        // Reads with deletes carry metadata columns (_pos) after the schema's: match by id.
        if (record.struct() != positionsFor) {
          positionsFor = record.struct();
          positions = positions(struct, positionsFor);
          if (lineage) {
            lineagePositions = positions(LINEAGE, positionsFor);
          }
        }
        if (lineage) {
          Object rowId = record.get(lineagePositions[0]);
          Object sequence = record.get(lineagePositions[1]);
          lineages.add("[" + rowId + "," + sequence + "]"); // Long or null
        }
        StringBuilder row = new StringBuilder("[");
        for (int i = 0; i < positions.length; i++) {
          if (i > 0) {
            row.append(',');
          }
          canon(row, struct.fields().get(i).type(), record.get(positions[i]));
        }
        canonical.add(row.append(']').toString());
      }
    } catch (RuntimeException | IOException e) {
      throw new IllegalStateException(what + ": reading rows: " + e, e);
    }
    out.key("columns").begin('[');
    for (Types.NestedField field : struct.fields()) {
      out.string(field.name());
    }
    out.end(']');
    out.key("row_count").raw(Integer.toString(canonical.size()));
    out.key("rows").begin('[');
    canonical.forEach(out::string);
    out.end(']');
    if (lineage) {
      out.key("lineage").begin('[');
      lineages.forEach(out::raw);
      out.end(']');
    }
  }

  /** Where each field of {@code schema} sits in a record of type {@code record}, by field id. */
  private static int[] positions(Types.StructType schema, Types.StructType record) {
    List<Types.NestedField> fields = record.fields();
    int[] positions = new int[schema.fields().size()];
    for (int i = 0; i < positions.length; i++) {
      int id = schema.fields().get(i).fieldId();
      positions[i] = -1;
      for (int j = 0; j < fields.size() && positions[i] < 0; j++) {
        if (fields.get(j).fieldId() == id) {
          positions[i] = j;
        }
      }
      if (positions[i] < 0) {
        throw new IllegalStateException(
            "records lack field " + schema.fields().get(i) + ": " + record);
      }
    }
    return positions;
  }

  /**
   * Appends the canonical text of one value: JSON with no spaces, strings escaped as Python's
   * {@code json.dumps} (ASCII only); floats (float widened to double) as the shortest plain
   * decimal that reads back as the same double, NaN and infinities as strings, "-0" kept;
   * decimals as plain strings at their scale; binary and fixed as lowercase hex; dates ISO;
   * times and timestamps with 6 (nanos: 9) fraction digits, timestamptz in UTC with "+00:00";
   * structs as objects in field order; maps as [key, value] pairs sorted by their text.
   */
  public static void canon(StringBuilder sb, Type type, Object value) {
    if (value == null) {
      sb.append("null");
      return;
    }
    switch (type.typeId()) {
      case BOOLEAN -> sb.append(((Boolean) value) ? "true" : "false");
      case INTEGER, LONG -> sb.append(((Number) value).longValue());
      case FLOAT -> floating(sb, ((Float) value).doubleValue());
      case DOUBLE -> floating(sb, (Double) value);
      case DECIMAL -> Json.quote(sb, ((BigDecimal) value).toPlainString());
      case STRING, UUID -> Json.quote(sb, value.toString());
      case FIXED, BINARY, GEOMETRY, GEOGRAPHY -> Json.quote(sb, hex(value));
      case DATE -> Json.quote(sb, ((LocalDate) value).toString());
      case TIME -> Json.quote(sb, time((LocalTime) value, 6));
      case TIMESTAMP -> Json.quote(sb, timestamp(value, 6));
      case TIMESTAMP_NANO -> Json.quote(sb, timestamp(value, 9));
      case STRUCT -> {
        List<Types.NestedField> fields = type.asStructType().fields();
        StructLike struct = (StructLike) value;
        sb.append('{');
        for (int i = 0; i < fields.size(); i++) {
          if (i > 0) {
            sb.append(',');
          }
          Json.quote(sb, fields.get(i).name());
          sb.append(':');
          canon(sb, fields.get(i).type(), struct.get(i, Object.class));
        }
        sb.append('}');
      }
      case LIST -> {
        Type element = type.asListType().elementType();
        sb.append('[');
        boolean first = true;
        for (Object item : (List<?>) value) {
          if (!first) {
            sb.append(',');
          }
          first = false;
          canon(sb, element, item);
        }
        sb.append(']');
      }
      case MAP -> {
        Types.MapType map = type.asMapType();
        List<String> pairs = new ArrayList<>();
        for (Map.Entry<?, ?> entry : ((Map<?, ?>) value).entrySet()) {
          StringBuilder pair = new StringBuilder("[");
          canon(pair, map.keyType(), entry.getKey());
          pair.append(',');
          canon(pair, map.valueType(), entry.getValue());
          pairs.add(pair.append(']').toString());
        }
        pairs.sort(null);
        sb.append('[').append(String.join(",", pairs)).append(']');
      }
      default -> Json.quote(sb, value.toString()); // variant: not compared by the Python side
    }
  }

  private static void floating(StringBuilder sb, double value) {
    if (Double.isNaN(value)) {
      sb.append("\"NaN\"");
    } else if (Double.isInfinite(value)) {
      sb.append(value > 0 ? "\"Infinity\"" : "\"-Infinity\"");
    } else if (value == 0) {
      sb.append(Double.doubleToRawLongBits(value) < 0 ? "-0" : "0");
    } else {
      sb.append(shortest(value).stripTrailingZeros().toPlainString());
    }
  }

  /** The fewest significant digits (correctly rounded, half-even) that read back as value. */
  private static BigDecimal shortest(double value) {
    BigDecimal exact = new BigDecimal(value);
    for (int digits = 1; digits < 17; digits++) {
      BigDecimal rounded = exact.round(new MathContext(digits, RoundingMode.HALF_EVEN));
      if (rounded.doubleValue() == value) {
        return rounded;
      }
    }
    return exact.round(new MathContext(17, RoundingMode.HALF_EVEN));
  }

  private static String hex(Object value) {
    if (value instanceof byte[] bytes) {
      return HEX.formatHex(bytes);
    }
    ByteBuffer buffer = ((ByteBuffer) value).duplicate();
    byte[] bytes = new byte[buffer.remaining()];
    buffer.get(bytes);
    return HEX.formatHex(bytes);
  }

  private static String time(LocalTime t, int digits) {
    long fraction = digits == 6 ? t.getNano() / 1000 : t.getNano();
    return String.format(
        "%02d:%02d:%02d.%0" + digits + "d", t.getHour(), t.getMinute(), t.getSecond(), fraction);
  }

  private static String timestamp(Object value, int digits) {
    if (value instanceof OffsetDateTime odt) {
      LocalDateTime utc = odt.withOffsetSameInstant(ZoneOffset.UTC).toLocalDateTime();
      return timestamp(utc, digits) + "+00:00";
    }
    LocalDateTime t = (LocalDateTime) value;
    return String.format(
        "%04d-%02d-%02dT%s",
        t.getYear(), t.getMonthValue(), t.getDayOfMonth(), time(t.toLocalTime(), digits));
  }

  /** Reads every entry of one manifest and materialises every field of every file. */
  private static ManifestInfo readManifest(
      Table table, ManifestFile manifest, Map<Integer, PartitionSpec> specs, FileIO io) {
    ManifestInfo info = new ManifestInfo(manifest);
    try {
      ManifestReader<?> reader =
          manifest.content() == ManifestContent.DATA
              ? ManifestFiles.read(manifest, io, specs)
              : ManifestFiles.readDeleteManifest(manifest, io, specs);
      readEntries(reader, table, specs.get(manifest.partitionSpecId()), info);
      touchSummaries(manifest, table, specs.get(manifest.partitionSpecId()));
    } catch (RuntimeException | IOException e) {
      throw new IllegalStateException("reading manifest " + manifest.path() + ": " + e, e);
    }
    return info;
  }

  private static <F extends ContentFile<F>> void readEntries(
      ManifestReader<F> reader, Table table, PartitionSpec spec, ManifestInfo info)
      throws IOException {
    ManifestEntries.forEach(
        reader,
        entry -> {
          info.count(entry.status(), entry.file());
          touchFile(entry.file(), table, spec);
        });
  }

  /** Reads every field of a data or delete file, decoding partition values and bounds. */
  private static void touchFile(ContentFile<?> file, Table table, PartitionSpec spec) {
    String path = file.location();
    try {
      file.content();
      file.format();
      file.specId();
      file.recordCount();
      file.fileSizeInBytes();
      file.columnSizes();
      file.valueCounts();
      file.nullValueCounts();
      file.nanValueCounts();
      file.keyMetadata();
      file.splitOffsets();
      List<Integer> equalityIds = file.equalityFieldIds();
      if (equalityIds != null) {
        for (Integer id : equalityIds) {
          if (id == null || table.schema().findField(id) == null && !inAnySchema(table, id)) {
            throw new IllegalStateException("equality field id " + id + " is in no schema");
          }
        }
      }
      file.sortOrderId();
      file.dataSequenceNumber();
      file.fileSequenceNumber();
      file.firstRowId();
      if (file instanceof org.apache.iceberg.DeleteFile delete) {
        delete.referencedDataFile();
        delete.contentOffset();
        delete.contentSizeInBytes();
      }
      StructLike partition = file.partition();
      List<Types.NestedField> partitionFields = spec.partitionType().fields();
      if (partition.size() != partitionFields.size()) {
        throw new IllegalStateException(
            "partition has " + partition.size() + " fields, spec " + partitionFields.size());
      }
      for (int i = 0; i < partitionFields.size(); i++) {
        // As Java's partition evaluators read it: throws unless the value has the right class.
        partition.get(i, partitionFields.get(i).type().typeId().javaClass());
      }
      decodeBounds(file.lowerBounds(), table);
      decodeBounds(file.upperBounds(), table);
    } catch (RuntimeException e) {
      throw new IllegalStateException("file " + path + ": " + e, e);
    }
  }

  private static void touchSummaries(ManifestFile manifest, Table table, PartitionSpec spec) {
    List<ManifestFile.PartitionFieldSummary> summaries = manifest.partitions();
    if (summaries == null) {
      return;
    }
    List<Types.NestedField> fields = spec.partitionType().fields();
    for (int i = 0; i < summaries.size() && i < fields.size(); i++) {
      ManifestFile.PartitionFieldSummary summary = summaries.get(i);
      summary.containsNull();
      summary.containsNaN();
      if (summary.lowerBound() != null) {
        Conversions.fromByteBuffer(fields.get(i).type(), summary.lowerBound());
      }
      if (summary.upperBound() != null) {
        Conversions.fromByteBuffer(fields.get(i).type(), summary.upperBound());
      }
    }
  }

  private static boolean inAnySchema(Table table, int id) {
    return table.schemas().values().stream().anyMatch(s -> s.findField(id) != null);
  }

  private static void decodeBounds(Map<Integer, ByteBuffer> bounds, Table table) {
    if (bounds == null) {
      return;
    }
    for (Map.Entry<Integer, ByteBuffer> bound : bounds.entrySet()) {
      Types.NestedField field = table.schema().findField(bound.getKey());
      if (field == null) {
        field =
            table.schemas().values().stream()
                .map(s -> s.findField(bound.getKey()))
                .filter(f -> f != null)
                .findFirst()
                .orElse(null);
      }
      if (field != null && field.type().isPrimitiveType()) {
        Conversions.fromByteBuffer(field.type(), bound.getValue());
      }
    }
  }

  /** What was read of one manifest. */
  private static final class ManifestInfo {
    final String path;
    final String content;
    final int specId;
    final int[] statusCounts = new int[3];
    final List<Long> snapshots = new ArrayList<>();

    ManifestInfo(ManifestFile manifest) {
      this.path = manifest.path();
      this.content = manifest.content() == ManifestContent.DATA ? "data" : "deletes";
      this.specId = manifest.partitionSpecId();
    }

    /** Live (existing and added) files by kind: data, equality and position deletes, DVs. */
    final Map<String, Integer> liveFiles = new TreeMap<>();

    void count(int status, ContentFile<?> file) {
      statusCounts[status]++;
      if (status != 2) {
        String kind =
            switch (file.content()) {
              case DATA -> "data";
              case EQUALITY_DELETES -> "equality_deletes";
              case POSITION_DELETES ->
                  file instanceof org.apache.iceberg.DeleteFile delete
                          && delete.contentOffset() != null
                      ? "deletion_vectors"
                      : "position_deletes";
              default -> String.valueOf(file.content()).toLowerCase(java.util.Locale.ROOT);
            };
        liveFiles.merge(kind, 1, Integer::sum);
      }
    }

    void write(Json out) {
      out.begin('{');
      out.key("path").string(path);
      out.key("content").string(content);
      out.key("spec_id").raw(Integer.toString(specId));
      out.key("existing").raw(Integer.toString(statusCounts[0]));
      out.key("added").raw(Integer.toString(statusCounts[1]));
      out.key("deleted").raw(Integer.toString(statusCounts[2]));
      out.key("snapshots").begin('[');
      snapshots.forEach(id -> out.raw(Long.toString(id)));
      out.end(']');
      out.key("live_files").begin('{');
      liveFiles.forEach((kind, n) -> out.key(kind).raw(Integer.toString(n)));
      out.end('}');
      out.end('}');
    }
  }

  /** A read-only FileIO over the local filesystem for {@code file:} URIs and plain paths. */
  static final class LocalFileIO implements FileIO {
    private static File local(String location) {
      if (location.startsWith("file://")) {
        return new File(location.substring("file://".length()));
      }
      if (location.startsWith("file:")) {
        return new File(location.substring("file:".length()));
      }
      if (location.contains("://")) {
        throw new IllegalArgumentException("not a local location: " + location);
      }
      return new File(location);
    }

    @Override
    public InputFile newInputFile(String path) {
      InputFile file = Files.localInput(local(path));
      return new InputFile() {
        @Override
        public long getLength() {
          return file.getLength();
        }

        @Override
        public org.apache.iceberg.io.SeekableInputStream newStream() {
          return file.newStream();
        }

        @Override
        public String location() {
          return path;
        }

        @Override
        public boolean exists() {
          return file.exists();
        }
      };
    }

    @Override
    public OutputFile newOutputFile(String path) {
      throw new UnsupportedOperationException("read-only: " + path);
    }

    @Override
    public void deleteFile(String path) {
      throw new UnsupportedOperationException("read-only: " + path);
    }
  }

  /** A minimal streaming JSON writer: commas are placed automatically. */
  public static final class Json {
    private final StringBuilder sb = new StringBuilder();
    private boolean needComma = false;

    public Json() {}

    public Json begin(char open) {
      comma();
      sb.append(open);
      needComma = false;
      return this;
    }

    public Json end(char close) {
      sb.append(close);
      needComma = true;
      return this;
    }

    public Json key(String name) {
      comma();
      quote(sb, name);
      sb.append(':');
      needComma = false;
      return this;
    }

    public Json string(String value) {
      comma();
      if (value == null) {
        sb.append("null");
      } else {
        quote(sb, value);
      }
      needComma = true;
      return this;
    }

    public Json raw(String token) {
      comma();
      sb.append(token);
      needComma = true;
      return this;
    }

    private void comma() {
      if (needComma) {
        sb.append(',');
      }
    }

    @Override
    public String toString() {
      return sb.toString();
    }

    /** Appends a JSON string exactly as Python's {@code json.dumps} (ensure_ascii) writes it. */
    public static void quote(StringBuilder sb, String s) {
      sb.append('"');
      for (int i = 0; i < s.length(); i++) {
        char c = s.charAt(i);
        switch (c) {
          case '"' -> sb.append("\\\"");
          case '\\' -> sb.append("\\\\");
          case '\n' -> sb.append("\\n");
          case '\r' -> sb.append("\\r");
          case '\t' -> sb.append("\\t");
          case '\b' -> sb.append("\\b");
          case '\f' -> sb.append("\\f");
          default -> {
            if (c < 0x20 || c > 0x7e) {
              sb.append(String.format("\\u%04x", (int) c));
            } else {
              sb.append(c);
            }
          }
        }
      }
      sb.append('"');
    }
  }
}
