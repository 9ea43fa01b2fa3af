"""The fixed text sample int8/uint8 ranges are calibrated on (data only).

Owned by the project and never edited in place: a model's ranges are
computed once from the embeddings of exactly these texts, so a query
quantized today and a document quantized months ago fall into the same
buckets. Changing the list would change ``TEXTS_ID`` and therefore start a
new calibration beside the old one, never silently replace it.

The texts mix questions and passages, short and long, over everyday,
scientific, technical and cultural topics, in some 40 languages, so that each
dimension's observed minimum and maximum resemble what real traffic reaches.
"""

from __future__ import annotations

import hashlib

CALIBRATION_TEXTS: tuple[str, ...] = (
    # English
    "What is the capital of Australia?",
    "How many bones are there in the adult human body?",
    "Photosynthesis converts light energy into chemical energy stored in glucose.",
    "The Treaty of Westphalia in 1648 ended the Thirty Years' War in Europe.",
    "how to reset a forgotten router password",
    "Best practices for writing unit tests in Python",
    "The mitochondria is the organelle where cellular respiration produces most of the ATP.",
    "Mount Everest, at 8,849 metres, is the highest mountain above sea level.",
    "Why is the sky blue during the day and red at sunset?",
    "A binary search finds an element in a sorted array in logarithmic time.",
    "The recipe calls for two cups of flour, one egg and a pinch of salt.",
    "Interest rates were raised by a quarter of a percentage point on Wednesday.",
    "Shakespeare wrote Hamlet around the year 1600.",
    "symptoms of vitamin D deficiency in adults",
    "The quarterly revenue grew 12% year over year, driven by cloud services.",
    "Tokyo hosted the Summer Olympic Games in 2021 after a one-year delay.",
    "def fibonacci(n): return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)",
    "SELECT name, COUNT(*) FROM orders GROUP BY name ORDER BY 2 DESC;",
    "The train to Edinburgh departs from platform 4 at 09:15.",
    "Who painted the ceiling of the Sistine Chapel?",
    "Black holes form when massive stars collapse under their own gravity at the end of their lives.",
    "The defendant pleaded not guilty to all charges.",
    "Our hotel room had a lovely view of the harbour, but the breakfast was disappointing.",
    "What are the side effects of ibuprofen?",
    "Neural networks learn representations by adjusting weights with gradient descent.",
    "The Amazon rainforest produces a significant share of the world's oxygen and hosts millions of species.",
    "Please find attached the invoice for March; payment is due within 30 days.",
    "Is it safe to eat raw cookie dough?",
    "The French Revolution began in 1789 with the storming of the Bastille.",
    "Electric cars convert about 77% of the electrical energy from the grid to power at the wheels.",
    "lyrics of a song about a yellow submarine",
    "The patient was admitted with chest pain and shortness of breath.",
    "Water boils at 100 degrees Celsius at sea level.",
    "The company announced layoffs affecting roughly 5% of its workforce.",
    "How do vaccines train the immune system?",
    "Jazz originated in the African-American communities of New Orleans in the late 19th century.",
    "ERROR 404: the requested page could not be found on this server.",
    "The cat slept on the warm windowsill all afternoon.",
    "Quantum computers use qubits, which can exist in superpositions of states.",
    "Which programming language should I learn first?",
    "The Great Barrier Reef is the world's largest coral reef system.",
    "Add the onions and fry them until golden brown, stirring occasionally.",
    "The striker scored twice in the second half to secure a 3-1 victory.",
    "Inflation measures how quickly prices for goods and services rise over time.",
    "where can i buy cheap flights to lisbon in october",
    "The Moon's gravity causes the ocean tides on Earth.",
    "Terms and conditions apply. Offer valid while stocks last.",
    "The novel follows a young orphan who discovers she has magical powers.",
    "What is the difference between a virus and a bacterium?",
    "Git tracks changes to files and lets teams merge their work.",
    "Mozart composed more than 600 works, including symphonies, operas and concertos.",
    "The bridge will be closed for maintenance from Friday night until Monday morning.",
    "1 kg = 2.20462 lb; 1 mile = 1.609 km.",
    "Thank you for your order! It will ship within two business days.",
    "The Industrial Revolution began in Britain in the 18th century and transformed manufacturing.",
    "How long should I boil an egg for a runny yolk?",
    "Antibiotics are ineffective against viral infections such as the common cold.",
    "The museum is open daily from 10 a.m. to 6 p.m., except on public holidays.",
    "Climate change is causing glaciers to retreat on every continent.",
    "I loved this phone at first, but the battery died after six months.",
    # German
    "Wie hoch ist die Zugspitze?",
    "Die Berliner Mauer fiel am 9. November 1989.",
    "Der Zug nach München hat heute eine Verspätung von zwanzig Minuten.",
    "Welche Unterlagen brauche ich für die Anmeldung meiner Wohnung?",
    "Die Energiewende soll den Anteil erneuerbarer Energien am Stromverbrauch deutlich erhöhen.",
    "Goethe schrieb den Faust in zwei Teilen über mehrere Jahrzehnte.",
    "Bitte schalten Sie Ihr Mobiltelefon während der Vorstellung aus.",
    "Rezept für einen einfachen Apfelkuchen mit Streuseln",
    # French
    "Quelle est la population de Paris ?",
    "La tour Eiffel a été construite pour l'Exposition universelle de 1889.",
    "Le médecin m'a prescrit des antibiotiques pendant une semaine.",
    "Comment faire une pâte à crêpes sans grumeaux ?",
    "Les élections législatives auront lieu dans un mois.",
    "Victor Hugo a publié Les Misérables en 1862.",
    "Le réchauffement climatique menace la biodiversité des océans.",
    "Nous vous remercions de votre patience pendant les travaux.",
    # Spanish
    "¿Cuál es el río más largo de América del Sur?",
    "Gabriel García Márquez escribió Cien años de soledad.",
    "El museo del Prado alberga obras de Velázquez y Goya.",
    "¿Cómo puedo renovar mi pasaporte en el consulado?",
    "La inflación se moderó en el último trimestre según el banco central.",
    "Los volcanes de Canarias se formaron por actividad de un punto caliente.",
    "Me encantó el restaurante, pero el servicio fue muy lento.",
    "La fotosíntesis ocurre en los cloroplastos de las células vegetales.",
    # Italian
    "Chi ha dipinto la Gioconda?",
    "Il Colosseo poteva ospitare circa cinquantamila spettatori.",
    "La pasta va cotta in abbondante acqua salata.",
    "Il treno regionale per Firenze è stato soppresso per sciopero.",
    "Dante Alighieri è considerato il padre della lingua italiana.",
    "Quali sono i sintomi dell'influenza stagionale?",
    # Portuguese
    "Qual é a maior cidade do Brasil?",
    "O Rio Amazonas é o maior rio do mundo em volume de água.",
    "A reunião foi adiada para a próxima segunda-feira.",
    "Como declarar o imposto de renda pela internet?",
    "Fernando Pessoa escreveu sob vários heterônimos.",
    "O time venceu o campeonato com dois gols no último minuto.",
    # Dutch
    "Hoeveel inwoners heeft Amsterdam?",
    "De Deltawerken beschermen Nederland tegen overstromingen.",
    "Rembrandt schilderde De Nachtwacht in 1642.",
    "Waar kan ik mijn fiets het beste laten repareren?",
    "De gemeente verhoogt volgend jaar de afvalstoffenheffing.",
    # Russian
    "Какая самая длинная река в России?",
    "Лев Толстой написал роман «Война и мир».",
    "Первый искусственный спутник Земли был запущен в 1957 году.",
    "Как приготовить борщ по классическому рецепту?",
    "Центральный банк сохранил ключевую ставку без изменений.",
    "Московское метро открылось в 1935 году.",
    "Врач рекомендовал пить больше воды и отдыхать.",
    # Polish
    "Kiedy Polska wstąpiła do Unii Europejskiej?",
    "Maria Skłodowska-Curie otrzymała dwie Nagrody Nobla.",
    "Pociąg do Krakowa odjeżdża z peronu drugiego.",
    "Jak złożyć wniosek o dowód osobisty przez internet?",
    "Wisła jest najdłuższą rzeką w Polsce.",
    # Ukrainian
    "Яка столиця України?",
    "Тарас Шевченко — видатний український поет і художник.",
    "Дніпро протікає через кілька великих міст.",
    # Czech
    "Karlův most v Praze byl postaven ve 14. století.",
    "Kde najdu nejbližší lékárnu s nepřetržitým provozem?",
    # Swedish
    "Hur lång tid tar det att köra från Stockholm till Göteborg?",
    "Nobelpriset delas ut varje år den 10 december.",
    "Vi ses på fikat klockan tre.",
    # Finnish
    "Suomessa on yli 180 000 järveä.",
    "Miten haen Kela-tukea opiskelijana?",
    # Greek
    "Ο Παρθενώνας χτίστηκε τον 5ο αιώνα π.Χ.",
    "Πόσο κοστίζει το εισιτήριο για τη Σαντορίνη;",
    "Η δημοκρατία γεννήθηκε στην αρχαία Αθήνα.",
    # Turkish
    "İstanbul Boğazı Avrupa ile Asya'yı ayırır.",
    "Türkiye'nin başkenti neresidir?",
    "Toplantı yarın saat onda başlayacak.",
    "Mercimek çorbası nasıl yapılır?",
    # Arabic
    "ما هي عاصمة المملكة العربية السعودية؟",
    "يعتبر نهر النيل أطول نهر في العالم.",
    "كتب نجيب محفوظ الثلاثية التي تصور الحياة في القاهرة.",
    "كيف أتعلم البرمجة من الصفر؟",
    "ارتفعت أسعار النفط بعد قرار خفض الإنتاج.",
    "الطقس اليوم مشمس مع رياح خفيفة.",
    # Hebrew
    "מה גובה הר החרמון?",
    "ירושלים היא אחת הערים העתיקות בעולם.",
    "הפגישה נדחתה ליום ראשון הבא.",
    # Persian
    "حافظ یکی از بزرگ‌ترین شاعران زبان فارسی است.",
    "چگونه می‌توانم ویزای تحصیلی بگیرم؟",
    # Hindi
    "भारत की राजधानी क्या है?",
    "ताजमहल का निर्माण शाहजहाँ ने अपनी पत्नी की याद में करवाया था।",
    "मानसून के दौरान भारी बारिश से बाढ़ का खतरा बढ़ जाता है।",
    "घर पर पनीर कैसे बनाएं?",
    "क्रिकेट भारत में सबसे लोकप्रिय खेल है।",
    # Bengali
    "রবীন্দ্রনাথ ঠাকুর ১৯১৩ সালে নোবেল পুরস্কার পান।",
    "ঢাকা বাংলাদেশের রাজধানী ও বৃহত্তম শহর।",
    "কীভাবে অনলাইনে ট্রেনের টিকিট কাটব?",
    # Tamil
    "தமிழ் உலகின் மிகப் பழமையான மொழிகளில் ஒன்றாகும்.",
    "சென்னையில் இன்று கனமழை பெய்யும்.",
    # Urdu
    "لاہور اپنے تاریخی باغات اور کھانوں کے لیے مشہور ہے۔",
    # Chinese
    "长城有多长？",
    "北京是中华人民共和国的首都。",
    "孔子是中国古代著名的思想家和教育家。",
    "如何在家里做红烧肉？",
    "人工智能正在改变许多行业的工作方式。",
    "今天下午会有雷阵雨，请带好雨伞。",
    "这家餐厅的服务很好，但是价格有点贵。",
    "台北101曾经是世界上最高的建筑。",
    # Japanese
    "富士山の高さは何メートルですか？",
    "東京は日本の首都で、世界有数の大都市です。",
    "新幹線は1964年に開業しました。",
    "おいしいラーメンの作り方を教えてください。",
    "明日の会議は午後二時からに変更になりました。",
    "桜の花は春に咲き、多くの人がお花見を楽しみます。",
    # Korean
    "서울의 인구는 얼마입니까?",
    "한글은 세종대왕이 1443년에 창제했습니다.",
    "김치찌개를 맛있게 끓이는 방법",
    "내일은 전국적으로 비가 내릴 예정입니다.",
    "이 노트북은 배터리가 오래 가서 만족합니다.",
    # Vietnamese
    "Thủ đô của Việt Nam là Hà Nội.",
    "Vịnh Hạ Long là di sản thiên nhiên thế giới.",
    "Làm thế nào để nấu phở bò ngon?",
    "Giá xăng dầu tăng nhẹ trong tuần này.",
    # Thai
    "กรุงเทพมหานครเป็นเมืองหลวงของประเทศไทย",
    "ต้มยำกุ้งเป็นอาหารไทยที่มีชื่อเสียง",
    "พรุ่งนี้จะมีฝนตกหนักในภาคใต้",
    # Indonesian / Malay
    "Berapa jumlah pulau di Indonesia?",
    "Candi Borobudur adalah candi Buddha terbesar di dunia.",
    "Cara membuat nasi goreng yang enak dan mudah",
    "Kuala Lumpur ialah ibu negara Malaysia.",
    # Tagalog
    "Ang Maynila ang kabisera ng Pilipinas.",
    # Swahili
    "Mlima Kilimanjaro ndio mlima mrefu zaidi barani Afrika.",
    "Ninawezaje kufungua akaunti ya benki?",
    "Kiswahili kinazungumzwa katika nchi nyingi za Afrika Mashariki.",
    # Amharic, Yoruba
    "አዲስ አበባ የኢትዮጵያ ዋና ከተማ ናት።",
    "Èdè Yorùbá jẹ́ ọ̀kan lára àwọn èdè tí a ń sọ ní Nàìjíríà.",
    # Georgian, Armenian
    "თბილისი საქართველოს დედაქალაქია.",
    "Երևանը Հայաստանի մայրաքաղաքն է։",
    # Hungarian, Romanian
    "A Duna Európa második leghosszabb folyója.",
    "Bucureștiul este capitala României.",
    # Mixed script, numbers, symbols, emoji
    "iPhone 15 Pro Max 256GB — precio, características y opiniones",
    "Meeting notes 2024-03-14: Q2 OKRs, hiring plan, 🚀 launch date TBD",
    "Error: ModuleNotFoundError: No module named 'numpy'",
    "🙂👍 great service, will come back!!!",
    "E = mc² relates mass and energy; c ≈ 299,792,458 m/s.",
    "https://example.com/search?q=embedding+models&lang=en",
)

# Identifies the sample: part of every calibration's key and of what /info reports.
TEXTS_ID: str = hashlib.sha256("\n".join(CALIBRATION_TEXTS).encode("utf-8")).hexdigest()[:16]
